# scripts/lib/plan_accuracy.awk — one table of doc/data (csv.awk's CSV)
# to plan-accuracy.csv's rows (scripts/plan-accuracy.sh): each
# subnetwork configuration's mean test accuracy minus the table's data
# parallel one, in points.  -v doc=PATH names where the table is shown.

# The value of option `name` in an options string, else def.
function opt(o, name, def,    i, w, n) {
    n = split(o, w, " ")
    for (i = 1; i < n; i++)
        if (w[i] == name)
            return w[i + 1]
    return def
}
NR == 1 { next }
{
    csv_split($0, f)
    c = f[1]
    if (!(c in sum)) {
        order[++n] = c
        opts[c] = f[14]
    }
    sum[c] += f[3]
    seeds[c]++
    if (base == "" && c ~ /data parallel/)
        base = c
}
END {
    if (base == "")
        exit
    b = sum[base] / seeds[base]
    for (i = 1; i <= n; i++) {
        c = order[i]
        o = opts[c]
        s = opt(o, "--strategy", "dp")
        if (s == "dp")
            continue
        key = s
        if (s == "sdp")
            key = sprintf("sdp %s C=%s", opt(o, "--subnet", "block"), opt(o, "--coverage", "0.5"))
        label = c
        gsub(/,/, ";", label)
        # synth trains an mlp unless told (its strategy's default)
        printf "%s,%s,%+.2f,%d,%s,%s\n", key,
               opt(o, "--model", s == "synth" ? "mlp" : "resmlp"),
               100 * (sum[c] / seeds[c] - b), seeds[c], label, doc
    }
}
