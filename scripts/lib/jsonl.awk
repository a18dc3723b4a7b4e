# scripts/lib/jsonl.awk — reading subtrain's metrics records (JSON Lines,
# src/train/metrics.c) in POSIX awk, for scripts/plot and scripts/sweep.
# Not a JSON parser: subtrain writes one object a line, no spaces, keys in
# a fixed order, numbers as %f/%zu.  What needs care is nesting:
# "optimizer" is a key of peak_bytes_by_kind and of step_ms, and the
# provenance record "run" (first record of a run) holds the configuration,
# whose values are strings ("workers":"4") that may contain anything.  So
# the numbers are read after jx_strip() has cut "run" out, and nested keys
# inside jx_obj()'s object.

# The index just past the '}' or ']' closing the object or array that
# starts at s[i] ('{' or '['), skipping strings and their escapes; 0 when
# it does not close.
function jx_close(s, i,    n, depth, c, instr) {
    n = length(s)
    depth = 0
    instr = 0
    for (; i <= n; i++) {
        c = substr(s, i, 1)
        if (instr) {
            if (c == "\\")
                i++
            else if (c == "\"")
                instr = 0
        } else if (c == "\"") {
            instr = 1
        } else if (c == "{" || c == "[") {
            depth++
        } else if (c == "}" || c == "]") {
            if (--depth == 0)
                return i + 1
        }
    }
    return 0
}

# The object (with its braces) that key k holds in s, or "" when s has no
# "k":{ ... }.  The first occurrence: call it on jx_strip()'s result for
# the record's own keys.
function jx_obj(s, k,    e) {
    if (!match(s, "\"" k "\":[{]"))
        return ""
    e = jx_close(s, RSTART + RLENGTH - 1)
    return e ? substr(s, RSTART + RLENGTH - 1, e - (RSTART + RLENGTH - 1)) : ""
}

# s without its "run" object (and the comma after it).
function jx_strip(s,    b, e) {
    if (!match(s, "\"run\":[{]"))
        return s
    b = RSTART
    e = jx_close(s, RSTART + RLENGTH - 1)
    if (!e)
        return s
    if (substr(s, e, 1) == ",")
        e++
    return substr(s, 1, b - 1) substr(s, e)
}

# The number key k holds in s, "" when absent (or null).
function jx_num(s, k) {
    if (!match(s, "\"" k "\":-?[0-9][-+0-9.eE]*"))
        return ""
    return substr(s, RSTART + length(k) + 3, RLENGTH - length(k) - 3)
}

# true/false of key k in s, "" when absent.
function jx_bool(s, k) {
    if (!match(s, "\"" k "\":(true|false)"))
        return ""
    return substr(s, RSTART + length(k) + 3, RLENGTH - length(k) - 3)
}

# The string key k holds in s (\" and \\ undone), "" when absent.
function jx_str(s, k,    i, n, c, v) {
    if (!match(s, "\"" k "\":\""))
        return ""
    n = length(s)
    v = ""
    for (i = RSTART + RLENGTH; i <= n; i++) {
        c = substr(s, i, 1)
        if (c == "\\") {
            c = substr(s, ++i, 1)
            if (c == "n")
                c = " "
        } else if (c == "\"") {
            break
        }
        v = v c
    }
    return v
}

# Every "key":"value" pair of a flat object of strings (run.config) into
# keys[1..n] and vals[key]; returns n.
function jx_pairs(obj, keys, vals,    n, rest, k, e) {
    n = 0
    rest = substr(obj, 2)
    while (match(rest, "^[,]?\"[^\"]*\":")) {
        k = substr(rest, RSTART, RLENGTH)
        sub("^[,]?\"", "", k)
        sub("\":$", "", k)
        rest = substr(rest, RLENGTH + 1)
        if (substr(rest, 1, 1) == "\"") {
            vals[k] = jx_str("\"v\":" rest, "v")
            # skip the string
            e = 2
            while (e <= length(rest)) {
                if (substr(rest, e, 1) == "\\")
                    e++
                else if (substr(rest, e, 1) == "\"")
                    break
                e++
            }
            rest = substr(rest, e + 1)
        } else if (match(rest, "^[^,}]*")) {
            vals[k] = substr(rest, 1, RLENGTH)
            rest = substr(rest, RLENGTH + 1)
        }
        keys[++n] = k
    }
    return n
}
