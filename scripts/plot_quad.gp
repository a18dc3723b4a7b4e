# scripts/plot_quad.gp — ||x^k - x*|| per iteration from `subtrain quad --csv`.
#
#   subtrain quad --csv quad.csv
#   gnuplot -e "csv='quad.csv'; png='quad.png'" scripts/plot_quad.gp
#
# csv and png default to quad.csv and quad.png.  Columns (doc/quad.md):
# iter, ist, ist_mean, gd (case 2's problem: b_i != 0, preconditioned
# Perm-1), ist_b0, gd_b0 (case 3's problem: b_i = 0, plain Perm-q).
# Log-scale y, clipped at 1e-17; exact zeros are not drawn.

if (!exists("csv")) csv = 'quad.csv'
if (!exists("png")) png = 'quad.png'

# pngcairo draws smoother lines; gnuplot builds without cairo have png.
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 900,560 enhanced font ",10"
} else {
    set terminal png size 900,560
}
set output png

set datafile separator ","
set key autotitle columnhead
set logscale y
set format y "10^{%L}"
set xlabel "iteration k"
set ylabel "||x^k - x*||"
set title "IST (one local step) and gradient descent on quadratics"
set grid
set key left bottom box opaque
# Below 1e-17 the b_i != 0 curves are float64 noise around x* (||x*|| ~ 1);
# the b_i = 0 ones (x* = 0) keep falling geometrically: clip them there.
set yrange [1e-17:*]

# Zeros and blanks are skipped by the log scale; keep only positive values.
pos(v) = (v > 0 ? v : NaN)

plot csv using 1:(pos($2)) with lines lw 1 lc rgb "#c06060" \
         title "IST, b_i != 0, one run (preconditioned Perm-1)", \
     csv using 1:(pos($3)) with lines lw 2 lc rgb "#a00000" \
         title "IST, b_i != 0, exact E x^k (stalls at ||x_{inf} - x*||)", \
     csv using 1:(pos($4)) with lines lw 2 lc rgb "#0050a0" \
         title "GD, b_i != 0 (step gamma / lambda_{max})", \
     csv using 1:(pos($5)) with lines lw 2 dt 2 lc rgb "#a06000" \
         title "IST, b_i = 0 (plain Perm-q, step gamma / Lambda)", \
     csv using 1:(pos($6)) with lines lw 2 dt 2 lc rgb "#008040" \
         title "GD, b_i = 0"
