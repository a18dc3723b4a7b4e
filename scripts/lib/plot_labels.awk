# scripts/lib/plot_labels.awk — scripts/plot's reading of metrics files
# (after jsonl.awk): for file i, tmp/i.dat holds epoch, wall s, test
# accuracy, test loss and train loss of each epoch record; tmp/bars.dat one
# line per file: i, label, peak MiB of the largest worker by kind (weights,
# gradients, optimizer, activations, workspace, attention), comm MB per
# worker-step (from the file's last record).  tmp/given-labels: labels
# from -l, one a line, for the first files.
#
# Labels: a file whose first record has "run" (the provenance record,
# {"config": {option: "value", ...}, ...}) is named by its model, its
# strategy with the options that shape it, its workers, then every other
# option whose value differs between the files; a file without it by its
# name.  Two files with the same label get their file names appended.

# Options that say where output goes, not what was run.
function ignored(k) {
    return k ~ /^(metrics|checkpoint|checkpoint[-_]?every|keep|progress|quiet|resume|usr1|config|dump[-_]?config|report|data)$/
}

function base(path) {
    sub(/.*\//, "", path)
    sub(/\.jsonl?$/, "", path)
    return path
}

BEGIN {
    FS = "\n"
    nf = 0
    ng = 0
    while ((getline line < (tmp "/given-labels")) > 0)
        given[++ng] = line
}

FNR == 1 {
    nf++
    name[nf] = FILENAME
    dat = tmp "/" nf ".dat"
    printf "" > dat
    last_epoch = ""
    r = jx_obj($0, "run")
    if (r != "") {
        has_run[nf] = 1
        n = jx_pairs(jx_obj(r, "config"), keys, vals)
        for (i = 1; i <= n; i++) {
            k = keys[i]
            cfg[nf, k] = vals[k]
            if (!(k in seen)) {
                seen[k] = 1
                order[++nkeys] = k
            }
        }
    }
}

{
    s = jx_strip($0)
    if (jx_bool(s, "interrupted") == "true")
        next
    e = jx_num(s, "epoch")
    if (e == "")
        next
    # the final record repeats the last epoch's
    if (jx_bool(s, "final") != "true" || e != last_epoch)
        printf "%s\t%s\t%s\t%s\t%s\n", e, jx_num(s, "wall_s"), jx_num(s, "test_acc"),
            jx_num(s, "test_loss"), jx_num(s, "train_loss") > dat
    last_epoch = e
    lastrec[nf] = s
}

FNR == 1 && nf > 1 { close(tmp "/" (nf - 1) ".dat") }

# Option k of file f's config, "" when absent; "local-steps" is also
# found spelled "local_steps" or "localsteps".
function opt(f, k,    u) {
    if ((f, k) in cfg)
        return cfg[f, k]
    u = k
    gsub(/-/, "_", u)
    if ((f, u) in cfg)
        return cfg[f, u]
    gsub(/_/, "", u)
    return (f, u) in cfg ? cfg[f, u] : ""
}

# The strategy and what shapes it, from a file's config.
function describe(f,    st, d, v) {
    st = opt(f, "strategy")
    d = opt(f, "model")
    if (st != "")
        d = d (d == "" ? "" : " ") st
    if (st == "sdp") {
        if ((v = opt(f, "subnet")) != "")
            d = d " " v
        if ((v = opt(f, "coverage")) != "")
            d = d " C=" v
    } else if (st == "ist") {
        if ((v = opt(f, "local-steps")) != "")
            d = d " R=" v
    } else if (st == "synth") {
        if ((v = opt(f, "segments")) != "")
            d = d " S=" v
    }
    if ((v = opt(f, "workers")) != "")
        d = d " N=" v
    return d
}

function shown(k) {
    return k ~ /^(model|strategy|subnet|coverage|local[-_]?steps|segments|workers)$/
}

END {
    for (f = 1; f <= nf; f++) {
        if (f <= ng && given[f] != "") {
            label[f] = given[f]
            continue
        }
        if (!has_run[f]) {
            label[f] = base(name[f])
            continue
        }
        label[f] = describe(f)
        # every other option on which the files with a "run" disagree
        for (j = 1; j <= nkeys; j++) {
            k = order[j]
            if (ignored(k) || shown(k) || !((f, k) in cfg))
                continue
            for (g = 1; g <= nf; g++)
                if (has_run[g] && (cfg[g, k] != cfg[f, k] || !((g, k) in cfg)))
                    break
            if (g <= nf)
                label[f] = label[f] " " k "=" cfg[f, k]
        }
        if (label[f] == "")
            label[f] = base(name[f])
    }
    for (f = 1; f <= nf; f++)
        for (g = 1; g <= nf; g++)
            if (g != f && label[g] == label[f] && !dup[f]) {
                dup[f] = 1
            }
    for (f = 1; f <= nf; f++) {
        if (dup[f])
            label[f] = label[f] " (" base(name[f]) ")"
        s = lastrec[f]
        m = jx_obj(s, "peak_bytes_by_kind")
        printf "%d\t%s", f, label[f] > (tmp "/bars.dat")
        split("weights gradients optimizer activations workspace attention", kinds, " ")
        for (k = 1; k <= 6; k++) {
            v = jx_num(m, kinds[k])
            printf "\t%.3f", (v == "" ? 0 : v) / 1048576 > (tmp "/bars.dat")
        }
        v = jx_num(s, "comm_bytes_per_worker_step")
        printf "\t%.4f\n", (v == "" ? 0 : v) / 1e6 > (tmp "/bars.dat")
    }
}
