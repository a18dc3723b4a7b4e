# scripts/lib/csv.awk — the CSV of scripts/sweep (runs.csv): fields
# quoted with "..." and "" for a quote, or bare.

# Splits a CSV line into f[1..n]; returns n.
function csv_split(line, f,    n, i, c, v, q, len) {
    n = 0
    v = ""
    q = 0
    len = length(line)
    for (i = 1; i <= len; i++) {
        c = substr(line, i, 1)
        if (q) {
            if (c == "\"") {
                if (substr(line, i + 1, 1) == "\"") {
                    v = v "\""
                    i++
                } else {
                    q = 0
                }
            } else {
                v = v c
            }
        } else if (c == "\"") {
            q = 1
        } else if (c == ",") {
            f[++n] = v
            v = ""
        } else {
            v = v c
        }
    }
    f[++n] = v
    return n
}
