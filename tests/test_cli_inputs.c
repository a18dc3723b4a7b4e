/*
 * tests/test_cli_inputs.c — what the program reads, and how a run that
 * cannot go on ends: weights that are not finite, files that are not
 * regular files (a FIFO would hang a reader), a signal while the data
 * loads, an IDX set of more classes than Fashion-MNIST's, a text corpus
 * over the limit, a run whose loss diverges.
 */
#define _GNU_SOURCE   /* realpath, usleep */
#include "cli_run.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zlib.h>

#include <criterion/criterion.h>
#include <subtrain/checkpoint.h>

/* A bound on a run's address space, for a test that a file is not read
 * whole (AddressSanitizer reserves terabytes of it: no bound there). */
#if defined(__SANITIZE_ADDRESS__)
#define BOUND_MEMORY ""
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BOUND_MEMORY ""
#endif
#endif
#ifndef BOUND_MEMORY
#define BOUND_MEMORY "ulimit -v 3000000;"
#endif

/* ------------------------------------------------------------ helpers */

/* A copy of the safetensors file `from` at `to` with element k of tensor
 * `name` set to v (the offset read with the library's reader), its
 * CRC-32 made to match: a file a writer wrote so, not a damaged one. */
static void copy_with_value(const char *from, const char *to, const char *name, size_t k,
                            float v)
{
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(from, &f), ST_OK, "%s", st_last_error());
    const st_safetensors_tensor *t = st_safetensors_find(&f, name);
    cr_assert_not_null(t, "%s has no tensor '%s'", from, name);
    cr_assert_gt(t->bytes, 4 * k);
    const size_t at = (size_t)((const uint8_t *)t->data - f.buf) + 4 * k;
    size_t n = 0;
    unsigned char *b = st_test_read_file(from, &n);
    cr_assert(b && n == f.size);
    memcpy(b + at, &v, 4);
    static const char key[] = "\"" ST_SAFETENSORS_CRC_KEY "\":\"";
    uint64_t h = 0;   /* the header's length, then the header */
    for (int i = 7; i >= 0; i--)
        h = h << 8 | b[i];
    size_t c = 8;
    while (c + sizeof key - 1 < 8 + h && memcmp(b + c, key, sizeof key - 1) != 0)
        c++;
    cr_assert_lt(c + sizeof key - 1, 8 + h, "%s records no CRC-32", from);
    char crc[9];
    snprintf(crc, sizeof crc, "%08lx", (unsigned long)crc32(0L, b + 8 + h, (uInt)(n - 8 - h)));
    memcpy(b + c + sizeof key - 1, crc, 8);
    cr_assert_eq(st_test_write_file(to, b, n), 0);
    free(b);
    st_safetensors_free(&f);
}

/* A failure of exactly one line on stderr holding every needle, and the
 * exit status want. */
static void expect_failure(const run_result *r, const char *args, int want, const char *n1,
                           const char *n2, const char *n3)
{
    cr_assert_eq(r->status, want, "'%s': exit %d (want %d): %s", args, r->status, want, r->err);
    cr_assert_eq(count_lines(r->err), 1, "'%s' printed: %s", args, r->err);
    cr_assert(strncmp(r->err, "subtrain: ", 10) == 0, "%s", r->err);
    const char *needles[3] = { n1, n2, n3 };
    for (int i = 0; i < 3; i++)
        cr_assert(!needles[i] || strstr(r->err, needles[i]), "'%s': no '%s' in: %s", args,
                  needles[i], r->err);
}

/* An unsigned-byte IDX file: dims[0..rank), then the bytes. */
static void write_idx(const char *path, const uint32_t *dims, int rank, const uint8_t *data)
{
    size_t count = 1;
    for (int i = 0; i < rank; i++)
        count *= dims[i];
    unsigned char *b = malloc(4 + 4 * (size_t)rank + count);
    cr_assert_not_null(b);
    b[0] = b[1] = 0;
    b[2] = 0x08;
    b[3] = (unsigned char)rank;
    for (int i = 0; i < rank; i++)
        for (int k = 0; k < 4; k++)
            b[4 + 4 * i + k] = (unsigned char)(dims[i] >> (24 - 8 * k));
    memcpy(b + 4 + 4 * rank, data, count);
    cr_assert_eq(st_test_write_file(path, b, 4 + 4 * (size_t)rank + count), 0);
    free(b);
}

/* ------------------------------------------------------------ weights */

/* A weights file or a step checkpoint holding a NaN or an infinity is
 * refused when it is read, naming the file and the tensor: eval trains
 * nothing, so "training diverged" would be wrong there, and training from
 * such weights would only diverge later. */
Test(inputs, weights_that_are_not_finite_are_refused_when_read, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], clean[ST_TEST_PATH_MAX], bad[ST_TEST_PATH_MAX],
        args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *model = "--data synthetic --model mlp --depth 1 --width 16 --batch 32";
    run_result *r = malloc(sizeof *r);
    snprintf(args, sizeof args, "%s --steps 4 --checkpoint-every 2 --progress none -q "
             "--checkpoint '%s/ck'", model, dir);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    snprintf(clean, sizeof clean, "%s/ck/final.safetensors", dir);

    st_test_path(bad, dir, "nan.safetensors");
    copy_with_value(clean, bad, "fc0.weight", 5, NAN);
    snprintf(args, sizeof args, "eval --init '%s' %s", bad, model);
    run(r, NULL, args);
    expect_failure(r, args, 1, "--init", "nan.safetensors: tensor 'fc0.weight' holds a NaN "
                   "at element 5", "must be finite");
    cr_assert_null(strstr(r->err, "diverged"), "%s", r->err);
    snprintf(args, sizeof args, "--init '%s' %s --steps 1 --progress none", bad, model);
    run(r, NULL, args);
    expect_failure(r, args, 1, "--init", "tensor 'fc0.weight' holds a NaN", NULL);

    st_test_path(bad, dir, "inf.safetensors");
    copy_with_value(clean, bad, "head.bias", 0, -INFINITY);
    snprintf(args, sizeof args, "eval --init '%s' %s", bad, model);
    run(r, NULL, args);
    expect_failure(r, args, 1, "inf.safetensors: tensor 'head.bias' holds -infinity at "
                   "element 0", NULL, NULL);

    /* a step checkpoint's optimizer state, read by --resume DIR */
    char ck[ST_TEST_PATH_MAX], resumed[ST_TEST_PATH_MAX];
    snprintf(ck, sizeof ck, "%s/ck/step-00000002.safetensors", dir);
    cr_assert_eq(mkdir(st_test_path(resumed, dir, "resume"), 0700), 0);
    st_test_path(bad, resumed, "step-00000002.safetensors");
    copy_with_value(ck, bad, "train.optimizer.v.worker0", 7, INFINITY);
    snprintf(args, sizeof args, "%s --steps 4 --progress none --resume '%s'", model, resumed);
    run(r, NULL, args);
    expect_failure(r, args, 1, "--resume", "tensor 'train.optimizer.v.worker0' holds +infinity "
                   "at element 7", NULL);
    free(r);
    st_test_rmdir_depth(dir, 2);
}

/* ------------------------------------------------------------ FIFOs */

/* Every file the program reads is refused at once when it is a FIFO (or
 * a device): nothing writes to it, and a reader would wait forever.  The
 * runs are under `timeout`: a reader that blocks fails with 124 here. */
Test(inputs, fifos_and_devices_are_refused_not_waited_for, .timeout = 240)
{
    char dir[ST_TEST_PATH_MAX], p[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *dirs[] = { "fashion", "fashiongz", "idx", "cifar10", "cifar100", "resume" };
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        st_test_path(p, dir, dirs[i]);
        cr_assert_eq(mkdir(p, 0700), 0);
    }
    const char *fifos[] = { "fifo", "fashion/train-images-idx3-ubyte",
                            "fashiongz/train-images-idx3-ubyte.gz", "idx/a",
                            "cifar10/data_batch_1.bin", "cifar100/train.bin",
                            "resume/step-00000003.safetensors" };
    for (size_t i = 0; i < sizeof fifos / sizeof *fifos; i++)
        cr_assert_eq(mkfifo(st_test_path(p, dir, fifos[i]), 0600), 0, "%s", strerror(errno));
    static const struct {
        const char *args, *what;   /* %1$s: the directory */
        int status;
    } cases[] = {
        { "eval --init '%1$s/fifo' --data synthetic", "--init: %1$s/fifo: ", 1 },
        { "--init '%1$s/fifo' --data synthetic --steps 1", "--init: %1$s/fifo: ", 1 },
        { "--config '%1$s/fifo'", "--config %1$s/fifo: ", 2 },
        { "--data synthetic --resume '%1$s/fifo'", "--resume: %1$s/fifo: ", 1 },
        { "--data synthetic --resume '%1$s/resume'",
          "%1$s/resume/step-00000003.safetensors: ", 1 },
        { "--data 'text:%1$s/fifo' --model gpt", "data: %1$s/fifo: ", 1 },
        { "--data '%1$s/fashion'", "%1$s/fashion/train-images-idx3-ubyte: ", 1 },
        { "--data '%1$s/fashiongz'", "%1$s/fashiongz/train-images-idx3-ubyte.gz: ", 1 },
        { "--data 'idx:%1$s/idx:a,b,c,d'", "%1$s/idx/a: ", 1 },
        { "--data 'cifar10:%1$s/cifar10'", "%1$s/cifar10/data_batch_1.bin: ", 1 },
        { "--data 'cifar100:%1$s/cifar100'", "%1$s/cifar100/train.bin: ", 1 },
    };
    run_result *r = malloc(sizeof *r);
    char what[2 * ST_TEST_PATH_MAX], fmt[512];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(fmt, sizeof fmt, "%s --progress none", cases[i].args);
        snprintf(args, sizeof args, fmt, dir);
        snprintf(what, sizeof what, cases[i].what, dir);
        run(r, "timeout 60", args);
        expect_failure(r, args, cases[i].status, what, "not a regular file (a FIFO)", NULL);
    }
    const char *dev = "--data text:/dev/zero --model gpt --progress none";
    run(r, "timeout 60", dev);
    expect_failure(r, dev, 1, "/dev/zero: not a regular file (a character device)", NULL, NULL);
    dev = "eval --init /dev/null --data synthetic";
    run(r, "timeout 60", dev);
    expect_failure(r, dev, 1, "/dev/null: not a regular file (a character device)", NULL, NULL);
    /* a topology described by XML: hwloc reads the file itself */
    char env[2 * ST_TEST_PATH_MAX];
    snprintf(env, sizeof env, "HWLOC_XMLFILE='%s/fifo' timeout -s KILL 60", dir);
    run(r, env, "--data synthetic --steps 1 --progress none");
    expect_failure(r, env, 1, "HWLOC_XMLFILE=", "fifo: not a regular file (a FIFO)", NULL);
    snprintf(args, sizeof args, "topo --topology 'xml:%s/fifo'", dir);
    run(r, "timeout -s KILL 60", args);
    cr_assert_eq(r->status, 1, "'%s': exit %d: %s", args, r->status, r->err);
    cr_assert(count_lines(r->err) == 1 && strncmp(r->err, "subtrain topo: ", 15) == 0 &&
              strstr(r->err, "fifo: not a regular file (a FIFO)"), "'%s': %s", args, r->err);
    free(r);
    st_test_rmdir(dir);
}

/* ------------------------------------------------------------ signals */

/* Whether process pid has `path` open (its /proc/PID/fd links). */
static int has_open(pid_t pid, const char *path)
{
    char fds[64], link[ST_TEST_PATH_MAX], to[ST_TEST_PATH_MAX];
    snprintf(fds, sizeof fds, "/proc/%ld/fd", (long)pid);
    DIR *d = opendir(fds);
    if (!d)
        return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d)) != NULL;) {
        snprintf(link, sizeof link, "%s/%s", fds, e->d_name);
        ssize_t n = readlink(link, to, sizeof to - 1);
        to[n > 0 ? n : 0] = '\0';
        found = n > 0 && strcmp(to, path) == 0;
    }
    closedir(d);
    return found;
}

/* A gzip file of `members` members, each 1 MiB of 'a': a text corpus that
 * takes a while to inflate and little room on disk. */
static void write_gzip_text(const char *path, int members)
{
    static unsigned char in[1 << 20], out[1 << 16];
    memset(in, 'a', sizeof in);
    z_stream z;
    memset(&z, 0, sizeof z);
    cr_assert_eq(deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = in;
    z.avail_in = sizeof in;
    z.next_out = out;
    z.avail_out = sizeof out;
    cr_assert_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
    const size_t n = sizeof out - z.avail_out;
    deflateEnd(&z);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < members; i++)
        cr_assert_eq(fwrite(out, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* One run of the program (argv) with its output in dir/out and dir/err;
 * the signals sigs[0..n) are sent while it has `data` open, that is while
 * it loads its data: the process is stopped (SIGSTOP), its open files
 * read, and only if the data file is among them a signal is sent before
 * it goes on (SIGCONT), so each arrives inside the loading whatever the
 * machine's speed; the next only once the handler has said its line for
 * the last.  Returns the exit status, or -1 when the run got past its
 * loading before every signal was sent (the caller tries again). */
static int signals_while_loading(char *const argv[], const char *dir, const char *data,
                                 const int *sigs, int n)
{
    char out[ST_TEST_PATH_MAX], err[ST_TEST_PATH_MAX], said[4096];
    st_test_path(out, dir, "out");
    st_test_path(err, dir, "err");
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int in = open("/dev/null", O_RDONLY);
        if (o < 0 || e < 0 || in < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0 || dup2(in, 0) < 0)
            _exit(120);
        execv(argv[0], argv);
        _exit(121);
    }
    int st, sent = 0;
    for (;;) {
        if (kill(pid, SIGSTOP) != 0)
            break;
        if (waitpid(pid, &st, WUNTRACED) != pid)
            break;
        if (!WIFSTOPPED(st))   /* it ended first */
            break;
        read_into(err, said, sizeof said);
        if (has_open(pid, data) && count_lines(said) == sent)
            kill(pid, sigs[sent++]);
        kill(pid, SIGCONT);
        if (sent == n)
            break;
        usleep(200);
    }
    if (sent < n) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        return -1;
    }
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "the run was killed by signal %d", WTERMSIG(st));
    return WEXITSTATUS(st);
}

/* SIGTERM while the data loads ends the run once that is read, without
 * training: exit 143 and one line on stderr (no "Interrupted system
 * call": the handlers restart what they interrupt), no banner, no step,
 * no metrics file; a second SIGINT ends it at once, removing the metrics
 * file it made too. */
Test(inputs, a_signal_while_the_data_loads_ends_the_run_before_training, .timeout = 240)
{
    char dir[ST_TEST_PATH_MAX], data[ST_TEST_PATH_MAX], real[PATH_MAX],
        opt[ST_TEST_PATH_MAX + 8], metrics[ST_TEST_PATH_MAX], text[16384];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(data, dir, "corpus.txt.gz");
    write_gzip_text(data, 30);
    cr_assert_not_null(realpath(data, real));
    snprintf(opt, sizeof opt, "text:%s", data);
    st_test_path(metrics, dir, "m.jsonl");
    char *argv[] = { getenv("SUBTRAIN_BIN"), "--data", opt, "--model", "gpt", "--depth", "1",
                     "--width", "16", "--heads", "1", "--context", "8", "--steps", "1",
                     "--val-bytes", "1000", "--progress", "none", "--metrics", metrics, NULL };
    cr_assert(argv[0] && *argv[0], "SUBTRAIN_BIN is not set");
    int status = -1;
    const int term[] = { SIGTERM }, twice[] = { SIGINT, SIGINT };
    for (int tries = 0; status < 0 && tries < 5; tries++)
        status = signals_while_loading(argv, dir, real, term, 1);
    cr_assert_neq(status, -1, "five runs loaded their data before they could be stopped");
    st_test_path(data, dir, "err");
    read_into(data, text, sizeof text);
    cr_assert_eq(status, 128 + SIGTERM, "exit %d: %s", status, text);
    cr_assert_eq(count_lines(text), 1, "%s", text);
    cr_assert(strstr(text, "subtrain: stopping before training starts"), "%s", text);
    st_test_path(data, dir, "out");
    read_into(data, text, sizeof text);
    cr_assert(!strstr(text, "| data ") && !strstr(text, "final:"), "it trained: %s", text);
    /* the metrics file it made is gone, also after a second SIGINT */
    cr_assert_neq(access(metrics, F_OK), 0, "a run stopped before training left %s", metrics);
    status = -1;
    for (int tries = 0; status < 0 && tries < 5; tries++)
        status = signals_while_loading(argv, dir, real, twice, 2);
    cr_assert_neq(status, -1, "five runs loaded their data before they took two signals");
    st_test_path(data, dir, "err");
    read_into(data, text, sizeof text);
    cr_assert(status == 128 + SIGINT && strstr(text, "subtrain: interrupted again"), "exit %d: "
              "%s", status, text);
    cr_assert_neq(access(metrics, F_OK), 0, "a run stopped at once left %s", metrics);
    st_test_rmdir(dir);
}

/* ------------------------------------------------------------ data sets */

/* `--data DIR` is Fashion-MNIST's 10 classes; an IDX set of 26 classes
 * there is refused with a message that names the form which reads the
 * class count from the labels, and that form trains on it. */
Test(inputs, a_plain_data_dir_with_more_classes_names_idx_dir, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], p[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    uint8_t images[52 * 16], labels[52];
    for (size_t i = 0; i < sizeof images; i++)
        images[i] = (uint8_t)(i * 37);
    for (int i = 0; i < 52; i++)
        labels[i] = (uint8_t)(i % 26);
    const uint32_t img_dims[3] = { 52, 4, 4 }, lab_dims[1] = { 52 };
    write_idx(st_test_path(p, dir, "train-images-idx3-ubyte"), img_dims, 3, images);
    write_idx(st_test_path(p, dir, "train-labels-idx1-ubyte"), lab_dims, 1, labels);
    write_idx(st_test_path(p, dir, "t10k-images-idx3-ubyte"), img_dims, 3, images);
    write_idx(st_test_path(p, dir, "t10k-labels-idx1-ubyte"), lab_dims, 1, labels);
    run_result *r = malloc(sizeof *r);
    snprintf(args, sizeof args, "--data '%s' --steps 1 --batch 4 --progress none", dir);
    run(r, NULL, args);
    expect_failure(r, args, 1, "train-labels-idx1-ubyte: label 10 is 10, outside 0..9",
                   "--data DIR takes Fashion-MNIST's 10 classes",
                   "--data idx:DIR reads the class count from the labels");
    snprintf(args, sizeof args, "--data 'idx:%s' --steps 1 --batch 4 --progress none", dir);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "26 classes"), "%s", r->out);
    free(r);
    st_test_rmdir(dir);
}

/* A text corpus larger than the 4 GiB a corpus may hold is refused
 * before a byte is read, with its size and the limit.  The file is
 * sparse (no disk), and the run's address space is bounded below the
 * file's size, so a reader that read it would fail otherwise. */
Test(inputs, a_text_corpus_over_the_limit_is_refused_before_reading, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], p[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(p, dir, "big.txt");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, ((off_t)1 << 32) + 1), 0, "%s", strerror(errno));
    close(fd);
    run_result *r = malloc(sizeof *r);
    snprintf(args, sizeof args, "--data 'text:%s' --model gpt --progress none", p);
    run(r, BOUND_MEMORY, args);
    expect_failure(r, args, 1, "big.txt: 4294967297 bytes, more than a text corpus may hold",
                   "(4294967296 bytes, 4 GiB)", NULL);
    free(r);
    st_test_rmdir(dir);
}

/* ------------------------------------------------------------ divergence */

/* A run whose loss becomes infinite keeps the records it wrote and ends
 * its metrics with a final record that says why ("stopped":"diverged"),
 * exit 1 and one line.  SGD at lr 12 on this task diverges in its second
 * epoch (of 32 steps), after the first epoch's record. */
Test(inputs, a_diverged_run_keeps_its_records_and_says_why, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], m[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(m, dir, "m.jsonl");
    snprintf(args, sizeof args, "--data synthetic --model mlp --depth 1 --width 16 --epochs 5 "
             "--batch 512 --optimizer sgd --schedule constant --lr 12 --progress none "
             "--metrics '%s'", m);
    run_result *r = malloc(sizeof *r);
    run(r, NULL, args);
    expect_failure(r, args, 1, "subtrain: training: the loss is not finite", NULL, NULL);
    static char rec[1 << 16];
    read_into(m, rec, sizeof rec);
    expect_json_lines(rec);
    const int lines = count_lines(rec);
    cr_assert_geq(lines, 2, "the records before the divergence, then the final one: %s", rec);
    const char *last = rec;
    for (int i = 0; i + 1 < lines; i++) {
        cr_assert(strstr(last, "\"final\":false"), "record %d: %s", i + 1, last);
        last = strchr(last, '\n') + 1;
    }
    cr_assert(strncmp(last, "{\"stopped\":\"diverged\",", 22) == 0, "%s", last);
    cr_assert(strstr(last, "\"final\":true,\"train_loss\":null,\"test_loss\":null"), "%s", last);
    const double step = st_json_number_at(rec, last, "step");
    cr_assert(step >= 32, "it diverged after the first epoch's 32 steps: %s", last);
    free(r);
    st_test_rmdir(dir);
}
