# scripts/lib/summary.awk — one line per configuration from scripts/sweep's
# runs.csv: mean and sample standard deviation over the seeds that
# finished (exit 0).  Configurations keep the order of their first run.
#
#   awk -f scripts/lib/csv.awk -f scripts/lib/summary.awk runs.csv     markdown
#   awk -v mode=dat -f scripts/lib/csv.awk -f scripts/lib/summary.awk runs.csv
#       for gnuplot, tab-separated: index, label, runs, then mean and sd of
#       test_acc, test_loss, peak_mib, comm_mb_step, wall_s, align_mean
#
# runs.csv: a header line, then config,seed,<numbers...>,exit,options with
# config and options quoted ("" for a quote), numbers bare, "" if absent.

function add(k, name, x) {
    if (x == "")
        return
    cnt[k, name]++
    sum[k, name] += x
    sq[k, name] += x * x
    if (!((k, name) in lo) || x + 0 < lo[k, name] + 0)
        lo[k, name] = x
}

function mean(k, name) {
    return cnt[k, name] ? sum[k, name] / cnt[k, name] : ""
}

# Sample standard deviation (n - 1); "" below two values.
function sd(k, name,    n, m, v) {
    n = cnt[k, name]
    if (n < 2)
        return ""
    m = sum[k, name] / n
    v = (sq[k, name] - n * m * m) / (n - 1)
    return v > 0 ? sqrt(v) : 0
}

# "mean ± sd" at the precision fmt; the sd is left out when it prints as
# zero and zero_sd_hidden is set (memory and bytes: the same every seed).
function pm(k, name, fmt, zero_sd_hidden,    m, s, t) {
    m = mean(k, name)
    if (m == "")
        return "–"
    t = sprintf(fmt, m)
    s = sd(k, name)
    if (s == "")
        return t
    s = sprintf(fmt, s)
    if (zero_sd_hidden && s + 0 == 0)
        return t
    return t " ± " s
}

BEGIN {
    FS = "\n"
    if (mode == "")
        mode = "md"
}

NR == 1 {
    nh = csv_split($0, h)
    for (i = 1; i <= nh; i++)
        col[h[i]] = i
    if (!("config" in col) || !("test_acc" in col)) {
        print "summary.awk: " FILENAME " is not a runs.csv of scripts/sweep" > "/dev/stderr"
        bad = 1
        exit 2
    }
    next
}

{
    csv_split($0, f)
    k = f[col["config"]]
    if (!(k in idx)) {
        idx[k] = ++nk
        label[nk] = k
    }
    j = idx[k]
    tried[j]++
    seeds[j] = seeds[j] (seeds[j] == "" ? "" : " ") f[col["seed"]]
    if (f[col["exit"]] != "0" || f[col["test_acc"]] == "")
        next
    ok[j]++
    add(j, "acc", f[col["test_acc"]])
    add(j, "loss", f[col["test_loss"]])
    add(j, "peak", f[col["peak_mib"]])
    add(j, "comm", f[col["comm_mb_step"]])
    add(j, "round", f[col["comm_mb_round"]])
    add(j, "wall", f[col["wall_s"]])
    add(j, "align", f[col["align_mean"]])
    add(j, "alignmin", f[col["align_min"]])
    if (f[col["comm_mb_round"]] != "")
        any_round = 1
    if (f[col["align_mean"]] != "")
        any_align = 1
}

END {
    if (bad)
        exit 2
    if (mode == "dat") {
        for (j = 1; j <= nk; j++) {
            printf "%d\t%s\t%d", j, label[j], ok[j] + 0
            split("acc loss peak comm wall align", names, " ")
            for (i = 1; i <= 6; i++) {
                m = mean(j, names[i])
                s = sd(j, names[i])
                printf "\t%s\t%s", m == "" ? "NaN" : m, s == "" ? 0 : s
            }
            printf "\n"
        }
        exit 0
    }
    head = "| configuration | seeds | test acc | test loss | peak MiB per worker | comm MB per worker-step |"
    rule = "| --- | --- | --- | --- | --- | --- |"
    if (any_round) {
        head = head " per round |"
        rule = rule " --- |"
    }
    head = head " wall s |"
    rule = rule " --- |"
    if (any_align) {
        head = head " grad alignment mean (min) |"
        rule = rule " --- |"
    }
    print head
    print rule
    for (j = 1; j <= nk; j++) {
        n = ok[j] + 0
        runs = n == tried[j] ? seeds[j] : n " of " tried[j] " (" seeds[j] ")"
        line = "| " label[j] " | " runs " | " pm(j, "acc", "%.4f") " | " pm(j, "loss", "%.3f")
        line = line " | " pm(j, "peak", "%.1f", 1) " | " pm(j, "comm", "%.2f", 1) " |"
        if (any_round)
            line = line " " pm(j, "round", "%.2f", 1) " |"
        line = line " " pm(j, "wall", "%.1f") " |"
        if (any_align)
            line = line " " (cnt[j, "align"] ? pm(j, "align", "%.3f") \
                             sprintf(" (%.3f)", lo[j, "alignmin"]) : "–") " |"
        print line
    }
}
