# scripts/lib/compare.awk — differences between configurations of a
# sweep's runs.csv, against the spread of the seeds (after csv.awk).
#
#   awk -v what=acc|loss|align|peak -f csv.awk -f compare.awk PAIRS runs.csv
#
# PAIRS: one comparison a line, "LABEL A | LABEL B" (a spec's labels hold
# no |).  Prints, for each,
# B's mean minus A's (accuracy in points, test loss in nats, alignment as
# a cosine) and
# whether it exceeds the seed spread: |difference| > sd(A) + sd(B), i.e.
# the two mean ± sd intervals do not overlap (sample sd over the seeds
# that finished); peak: B's mean peak MiB per worker over A's.  A pair
# missing a configuration says so.

BEGIN {
    FS = "\n"
    if (what == "")
        what = "acc"
}

FNR == NR {
    split($0, p, "|")
    gsub(/^ +| +$/, "", p[1])
    gsub(/^ +| +$/, "", p[2])
    na++
    pa[na] = p[1]
    pb[na] = p[2]
    next
}

FNR == 1 {
    csv_split($0, h)
    for (i in h)
        col[h[i]] = i
    c = what == "align" ? col["align_mean"] : what == "peak" ? col["peak_mib"] : \
        what == "loss" ? col["test_loss"] : col["test_acc"]
    next
}

{
    csv_split($0, f)
    if (f[col["exit"]] != "0" || f[c] == "")
        next
    k = f[col["config"]]
    n[k]++
    s[k] += f[c]
    q[k] += f[c] * f[c]
}

function sd(k,    m, v) {
    if (n[k] < 2)
        return 0
    m = s[k] / n[k]
    v = (q[k] - n[k] * m * m) / (n[k] - 1)
    return v > 0 ? sqrt(v) : 0
}

END {
    scale = what == "acc" ? 100 : 1
    unit = what == "acc" ? " points" : ""
    fmt = what == "acc" ? "%+.2f" : what == "loss" ? "%+.4f" : "%+.3f"
    for (i = 1; i <= na; i++) {
        a = pa[i]
        b = pb[i]
        if (!n[a] || !n[b]) {
            printf "- %s against %s: not measured (%s)\n", b, a, !n[a] ? a : b
            continue
        }
        if (what == "peak") {
            printf "- %s against %s: %.1f / %.1f MiB = %.2fx\n", b, a, s[b] / n[b], s[a] / n[a],
                (s[b] / n[b]) / (s[a] / n[a])
            continue
        }
        d = (s[b] / n[b] - s[a] / n[a]) * scale
        spread = (sd(a) + sd(b)) * scale
        verdict = n[a] < 2 || n[b] < 2 ? "one seed: no spread" : \
                  (d > spread || -d > spread ? "exceeds the seed spread" : "within the seed spread")
        printf "- %s against %s: " fmt "%s (sd %.2g + %.2g = %.2g%s): %s\n", b, a, d, unit,
            sd(a) * scale, sd(b) * scale, spread, unit, verdict
    }
}
