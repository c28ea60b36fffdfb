/*
 * test_store — versioned directories: round trip, MANIFEST mismatch detection (corrupt
 * byte, truncation, missing and extra files, damaged manifest), leftover temp removal,
 * the data dir lock, CURRENT switching, crash safety (a child killed with SIGKILL at every
 * durable step and at random times, then the store is reopened and checked), and write
 * errors: real ENOSPC on a tiny tmpfs (in a private mount namespace, skipped when that is
 * not permitted) and EFBIG from RLIMIT_FSIZE.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "store/store.h"
#include "store/store_int.h" /* white-box: the internals under test */

static char base[512];

static void make_base(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(base, sizeof base, "%s/tsr-store-XXXXXX", t && t[0] ? t : P_tmpdir);
    if (mkdtemp(base) == NULL) {
        perror("mkdtemp");
        abort();
    }
}

static void rm_rf(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "cleanup of %s failed\n", path);
}

static int setup(void **state)
{
    make_base();
    return 0;
}

static int teardown(void **state)
{
    rm_rf(base);
    return 0;
}

static void sub(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", base, name);
}

static void fill(unsigned char *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        buf[i] = (unsigned char)(seed >> 16);
    }
}

/* Writes version v with three files (one buffered, one streamed, one placed by "foreign"
 * code directly in the temp dir) of about `size` bytes each. */
static int write_version(tsr_store *s, uint64_t v, size_t size, tsr_error *err)
{
    unsigned char *buf = malloc(size + 1);
    fill(buf, size, (unsigned)v);
    tsr_store_txn *t;
    int rc = tsr_store_begin(s, v, &t, err);
    if (rc != 0)
        goto out;
    if ((rc = tsr_store_txn_write_file(t, "slice.faiss", buf, size, err)) != 0)
        goto abort;
    tsr_store_file *f;
    if ((rc = tsr_store_file_open(t, "vectors.f32", &f, err)) != 0)
        goto abort;
    for (size_t off = 0; off < size; off += 1000) {
        size_t n = size - off < 1000 ? size - off : 1000;
        if ((rc = tsr_store_file_write(f, buf + off, n, err)) != 0) {
            tsr_store_file_abort(f);
            goto abort;
        }
    }
    if ((rc = tsr_store_file_close(f, err)) != 0)
        goto abort;
    char path[1024];
    snprintf(path, sizeof path, "%s/meta", tsr_store_txn_dir(t));
    FILE *fp = fopen(path, "wb");
    if (fp == NULL || fwrite(buf, 1, size / 2, fp) != size / 2 || fclose(fp) != 0) {
        rc = tsr_err(err, TSR_EIO, "foreign write of %s failed", path);
        goto abort;
    }
    rc = tsr_store_commit(t, err);
    goto out;
abort:
    tsr_store_abort(t);
out:
    free(buf);
    return rc;
}

static void expect_file(tsr_store *s, uint64_t v, const char *name, size_t size)
{
    unsigned char *want = malloc(size + 1);
    fill(want, size, (unsigned)v);
    void *got;
    size_t len;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_store_read_file(s, v, name, 1 << 24, &got, &len, &err), 0);
    assert_int_equal(len, size);
    assert_memory_equal(got, want, size);
    free(got);
    free(want);
}

static void test_round_trip(void **state)
{
    char dir[600];
    sub(dir, sizeof dir, "data/nested");
    tsr_store *s;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_store_create(dir, &s, &err), 0);
    uint64_t cur;
    assert_int_equal(tsr_store_current(s, &cur, &err), TSR_ENOTFOUND);
    assert_int_equal(write_version(s, 42, 70000, &err), 0);
    assert_int_equal(tsr_store_set_current(s, 42, &err), 0);
    assert_int_equal(tsr_store_current(s, &cur, &err), 0);
    assert_int_equal(cur, 42);
    assert_int_equal(tsr_store_verify(s, 42, &err), 0);
    expect_file(s, 42, "slice.faiss", 70000);
    expect_file(s, 42, "vectors.f32", 70000);
    expect_file(s, 42, "meta", 35000);
    uint64_t *vs;
    size_t n;
    assert_int_equal(tsr_store_list(s, &vs, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(vs[0], 42);
    free(vs);
    /* on-disk names */
    char p[700];
    snprintf(p, sizeof p, "%s/v000042/MANIFEST", dir);
    assert_int_equal(access(p, R_OK), 0);
    snprintf(p, sizeof p, "%s/CURRENT", dir);
    FILE *fp = fopen(p, "r");
    char line[32] = "";
    assert_non_null(fgets(line, sizeof line, fp));
    fclose(fp);
    assert_string_equal(line, "v000042\n");
    /* bad names, duplicate names, open file at commit */
    tsr_store_txn *t;
    assert_int_equal(tsr_store_begin(s, 43, &t, &err), 0);
    tsr_store_txn *t2;
    assert_int_equal(tsr_store_begin(s, 44, &t2, &err), TSR_ESTATE);
    assert_int_equal(tsr_store_txn_write_file(t, "../x", "a", 1, &err), TSR_EINVAL);
    assert_int_equal(tsr_store_txn_write_file(t, "MANIFEST", "a", 1, &err), TSR_EINVAL);
    assert_int_equal(tsr_store_txn_write_file(t, ".hidden", "a", 1, &err), TSR_EINVAL);
    assert_int_equal(tsr_store_txn_write_file(t, "a", "a", 1, &err), 0);
    assert_int_equal(tsr_store_txn_write_file(t, "a", "a", 1, &err), TSR_EINVAL);
    tsr_store_file *f;
    assert_int_equal(tsr_store_file_open(t, "b", &f, &err), 0);
    assert_int_equal(tsr_store_commit(t, &err), TSR_ESTATE); /* t is not consumed */
    tsr_store_file_abort(f);
    tsr_store_abort(t);
    assert_int_equal(tsr_store_verify(s, 43, &err), TSR_ENOTFOUND);
    /* an empty version is fine */
    assert_int_equal(tsr_store_begin(s, 43, &t, &err), 0);
    assert_int_equal(tsr_store_commit(t, &err), 0);
    assert_int_equal(tsr_store_verify(s, 43, &err), 0);
    tsr_store_destroy(s);
}

static void expect_verify_error(tsr_store *s, uint64_t v, const char *what1, const char *what2)
{
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_store_verify(s, v, &err), TSR_EFORMAT);
    if (strstr(err.msg, what1) == NULL || (what2 && strstr(err.msg, what2) == NULL))
        fail_msg("verify message \"%s\" lacks \"%s\" / \"%s\"", err.msg, what1, what2 ? what2 : "");
}

static void test_manifest_mismatch(void **state)
{
    char dir[600], p[700];
    sub(dir, sizeof dir, "data");
    tsr_store *s;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_store_create(dir, &s, &err), 0);
    for (uint64_t v = 1; v <= 6; v++)
        assert_int_equal(write_version(s, v, 5000, &err), 0);

    /* one flipped byte: same size, checksum differs */
    snprintf(p, sizeof p, "%s/v000001/vectors.f32", dir);
    int fd = open(p, O_RDWR);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, 1234), 1);
    b ^= 0x01;
    assert_int_equal(pwrite(fd, &b, 1, 1234), 1);
    close(fd);
    expect_verify_error(s, 1, "vectors.f32", "checksum");

    /* truncation */
    snprintf(p, sizeof p, "%s/v000002/slice.faiss", dir);
    assert_int_equal(truncate(p, 4999), 0);
    expect_verify_error(s, 2, "slice.faiss", "size");

    /* a byte of the MANIFEST itself */
    snprintf(p, sizeof p, "%s/v000003/MANIFEST", dir);
    fd = open(p, O_RDWR);
    assert_int_equal(pread(fd, &b, 1, 40), 1);
    b = b == '7' ? '8' : '7';
    assert_int_equal(pwrite(fd, &b, 1, 40), 1);
    close(fd);
    expect_verify_error(s, 3, "MANIFEST", NULL);

    /* truncated MANIFEST */
    assert_int_equal(truncate(p, 30), 0);
    expect_verify_error(s, 3, "MANIFEST", NULL);

    /* a missing file, an extra file */
    snprintf(p, sizeof p, "%s/v000004/meta", dir);
    assert_int_equal(unlink(p), 0);
    expect_verify_error(s, 4, "meta", "missing");
    snprintf(p, sizeof p, "%s/v000005/extra", dir);
    FILE *fp = fopen(p, "w");
    fputs("x", fp);
    fclose(fp);
    expect_verify_error(s, 5, "extra", "not listed");
    /* no MANIFEST at all */
    snprintf(p, sizeof p, "%s/v000006/MANIFEST", dir);
    assert_int_equal(unlink(p), 0);
    expect_verify_error(s, 6, "MANIFEST", "missing");
    tsr_store_destroy(s);
}

static void test_leftovers_and_lock(void **state)
{
    char dir[600], p[700];
    sub(dir, sizeof dir, "data");
    tsr_store *s, *s2;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_store_create(dir, &s, &err), 0);
    assert_int_equal(write_version(s, 1, 100, &err), 0);
    assert_int_equal(tsr_store_set_current(s, 1, &err), 0);
    /* a second opener of the same dir is refused while the first holds it */
    assert_int_equal(tsr_store_create(dir, &s2, &err), TSR_ESTATE);
    assert_non_null(strstr(err.msg, "in use"));
    tsr_store_destroy(s);

    /* leftovers as a crash leaves them */
    snprintf(p, sizeof p, "%s/.tmp-v000002", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/.tmp-v000002/slice.faiss", dir);
    FILE *fp = fopen(p, "w");
    fputs("partial", fp);
    fclose(fp);
    snprintf(p, sizeof p, "%s/.tmp-rm-v000000", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/CURRENT.tmp", dir);
    fp = fopen(p, "w");
    fputs("v0000", fp);
    fclose(fp);
    assert_int_equal(tsr_store_create(dir, &s, &err), 0);
    DIR *d = opendir(dir);
    struct dirent *de;
    int leftovers = 0;
    while ((de = readdir(d)) != NULL)
        if (strncmp(de->d_name, ".tmp-", 5) == 0 || strcmp(de->d_name, "CURRENT.tmp") == 0)
            leftovers++;
    closedir(d);
    assert_int_equal(leftovers, 0);
    uint64_t cur;
    assert_int_equal(tsr_store_current(s, &cur, &err), 0);
    assert_int_equal(cur, 1);
    tsr_store_destroy(s);
}

static void test_current_switch(void **state)
{
    char dir[600], p[700];
    sub(dir, sizeof dir, "data");
    tsr_store *s;
    tsr_error err = TSR_ERROR_INIT;
    uint64_t cur, *vs;
    size_t n;
    assert_int_equal(tsr_store_create(dir, &s, &err), 0);
    assert_int_equal(write_version(s, 1, 1000, &err), 0);
    assert_int_equal(tsr_store_set_current(s, 1, &err), 0);
    assert_int_equal(write_version(s, 2, 1000, &err), 0);
    assert_int_equal(tsr_store_current(s, &cur, &err), 0);
    assert_int_equal(cur, 1); /* commit alone does not switch */
    assert_int_equal(tsr_store_set_current(s, 2, &err), 0);
    assert_int_equal(tsr_store_current(s, &cur, &err), 0);
    assert_int_equal(cur, 2);
    assert_int_equal(tsr_store_remove(s, 2, &err), TSR_ESTATE);
    assert_int_equal(tsr_store_remove(s, 1, &err), 0);
    assert_int_equal(tsr_store_remove(s, 1, &err), TSR_ENOTFOUND);
    assert_int_equal(tsr_store_set_current(s, 99, &err), TSR_ENOTFOUND);
    assert_int_equal(tsr_store_begin(s, 2, &(tsr_store_txn *){NULL}, &err), TSR_ESTATE);
    assert_int_equal(write_version(s, 1000000, 10, &err), 0); /* wider than 6 digits */
    assert_int_equal(tsr_store_list(s, &vs, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(vs[0], 2);
    assert_int_equal(vs[1], 1000000);
    free(vs);
    /* a garbage CURRENT is a format error, not a crash */
    snprintf(p, sizeof p, "%s/CURRENT", dir);
    FILE *fp = fopen(p, "w");
    fputs("v0002x\n", fp);
    fclose(fp);
    assert_int_equal(tsr_store_current(s, &cur, &err), TSR_EFORMAT);
    assert_non_null(strstr(err.msg, "CURRENT"));
    tsr_store_destroy(s);
}

/* ---- crash safety ----------------------------------------------------------------------- */

static int hook_kill_at, hook_count;
static void kill_hook(const char *step)
{
    if (++hook_count == hook_kill_at)
        raise(SIGKILL);
}

/* Child: open the store and write + switch to versions from `first` on (count of them). */
static void child_writer(const char *dir, uint64_t first, int count, int kill_at)
{
    tsr_store *s;
    tsr_error err = TSR_ERROR_INIT;
    hook_kill_at = kill_at;
    hook_count = 0;
    tsr__store_hook = kill_at > 0 ? kill_hook : NULL;
    if (tsr_store_create(dir, &s, &err) != 0)
        _exit(2);
    for (int i = 0; i < count; i++) {
        if (write_version(s, first + (uint64_t)i, 40000, &err) != 0)
            _exit(3);
        if (tsr_store_set_current(s, first + (uint64_t)i, &err) != 0)
            _exit(4);
    }
    _exit(0);
}

/* After a crash: CURRENT names a version that verifies, CURRENT is old or newer, no
 * temp entry survives reopening, every committed version verifies. Returns CURRENT. */
static uint64_t check_consistent(const char *dir, uint64_t old)
{
    tsr_store *s;
    tsr_error err = TSR_ERROR_INIT;
    uint64_t cur, *vs;
    size_t n;
    if (tsr_store_create(dir, &s, &err) != 0)
        fail_msg("reopen: %s", err.msg);
    if (tsr_store_current(s, &cur, &err) != 0)
        fail_msg("current: %s", err.msg);
    if (cur < old)
        fail_msg("CURRENT went back from %llu to %llu", (unsigned long long)old,
                 (unsigned long long)cur);
    if (tsr_store_verify(s, cur, &err) != 0)
        fail_msg("CURRENT version does not verify: %s", err.msg);
    expect_file(s, cur, "slice.faiss", 40000);
    assert_int_equal(tsr_store_list(s, &vs, &n, &err), 0);
    for (size_t i = 0; i < n; i++)
        if (tsr_store_verify(s, vs[i], &err) != 0)
            fail_msg("committed version %llu does not verify: %s", (unsigned long long)vs[i], err.msg);
    free(vs);
    DIR *d = opendir(dir);
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strncmp(de->d_name, ".tmp-", 5) == 0)
            fail_msg("leftover %s after reopen", de->d_name);
    closedir(d);
    tsr_store_destroy(s);
    return cur;
}

static void test_crash_at_every_step(void **state)
{
    char dir[600];
    sub(dir, sizeof dir, "crash");
    /* version 1 is the old, served version */
    pid_t pid = fork();
    if (pid == 0)
        child_writer(dir, 1, 1, 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    uint64_t cur = 1, next = 2;
    int killed = 0, saw_old = 0, saw_new = 0;
    /* hooks: 2 file syncs, manifest, tmp dir, rename, data dir, CURRENT.tmp, CURRENT
     * rename, data dir; step 10 runs to the end */
    for (int step = 1; step <= 10; step++) {
        pid = fork();
        if (pid == 0)
            child_writer(dir, next, 1, step);
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
            killed++;
        else
            assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        uint64_t now = check_consistent(dir, cur);
        assert_true(now == cur || now == next);
        /* until the CURRENT rename (step 8) the old version must still be current */
        if (step < 8)
            assert_int_equal(now, cur);
        else
            assert_int_equal(now, next);
        saw_old += now == cur;
        saw_new += now == next;
        cur = now;
        next++;
    }
    assert_int_equal(killed, 9);
    assert_true(saw_old > 0 && saw_new > 0);
}

static void test_crash_random_kills(void **state)
{
    char dir[600];
    sub(dir, sizeof dir, "crash-random");
    pid_t pid = fork();
    if (pid == 0)
        child_writer(dir, 1, 1, 0);
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* time one version to spread the kills over a whole write */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid = fork();
    if (pid == 0)
        child_writer(dir, 2, 1, 0);
    waitpid(pid, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000;
    if (us < 1000)
        us = 1000;
    uint64_t cur = check_consistent(dir, 2), next = cur + 1;
    srand(7);
    int killed = 0, advanced = 0;
    /* At least 36 rounds; on a loaded machine the timed write above may be slower than the
     * ones below, so kills land after the write: keep going (bounded) with a shorter window
     * until more than 10 kills hit a write in progress. */
    int rounds = 0;
    for (int i = 0; i < 36 || (killed <= 10 && i < 400); i++) {
        rounds++;
        pid = fork();
        if (pid == 0)
            child_writer(dir, next, 3, 0);
        usleep((useconds_t)(rand() % (3 * us)));
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        killed += WIFSIGNALED(st);
        if (!WIFSIGNALED(st) && us > 1000)
            us = us * 3 / 4;
        uint64_t now = check_consistent(dir, cur);
        assert_true(now >= cur && now < next + 3);
        advanced += now > cur;
        cur = now;
        next += 3;
    }
    printf("random kills: %d of %d killed mid-write, CURRENT advanced in %d (window ~%ld us)\n",
           killed, rounds, advanced, us);
    assert_true(killed > 10);
}

/* ---- write errors -------------------------------------------------------------------------- */

/* In the child: the old version must survive a failed write of the next one. Exit codes:
 * 0 ok, 77 skipped, others = failure step. */
static int write_error_scenario(const char *dir, size_t big, const char *want)
{
    tsr_store *s;
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_store_create(dir, &s, &err) != 0)
        return 10;
    if (write_version(s, 1, 1000, &err) != 0 || tsr_store_set_current(s, 1, &err) != 0)
        return 11;
    int rc = write_version(s, 2, big, &err);
    if (rc != TSR_EIO) {
        fprintf(stderr, "expected TSR_EIO, got %d: %s\n", rc, err.msg);
        return 12;
    }
    if (strstr(err.msg, want) == NULL || strstr(err.msg, ".tmp-v000002/") == NULL) {
        fprintf(stderr, "message lacks \"%s\" or the file: %s\n", want, err.msg);
        return 13;
    }
    printf("write error reported as: %s\n", err.msg);
    fflush(stdout);
    uint64_t cur;
    if (tsr_store_current(s, &cur, &err) != 0 || cur != 1 || tsr_store_verify(s, 1, &err) != 0)
        return 14;
    uint64_t *vs;
    size_t n;
    if (tsr_store_list(s, &vs, &n, &err) != 0 || n != 1)
        return 15;
    free(vs);
    char p[700];
    snprintf(p, sizeof p, "%s/.tmp-v000002", dir);
    if (access(p, F_OK) == 0)
        return 16; /* the failed transaction cleaned up after itself */
    tsr_store_destroy(s);
    return 0;
}

static void test_enospc(void **state)
{
    char dir[600];
    sub(dir, sizeof dir, "tiny");
    assert_int_equal(mkdir(dir, 0755), 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
            mount("tmpfs", dir, "tmpfs", 0, "size=128k") != 0)
            _exit(77);
        _exit(write_error_scenario(dir, 1 << 20, "No space left on device"));
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) {
        printf("ENOSPC test skipped: cannot mount a private tmpfs here\n");
        return;
    }
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_efbig(void **state)
{
    char dir[600];
    sub(dir, sizeof dir, "fsize");
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {200000, 200000};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(20);
        _exit(write_error_scenario(dir, 300000, "File too large"));
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Records beside the versions: atomic write, sorted list without .tmp- leftovers, read with
 * a size limit, overwrite, remove, bad names refused, versions unaffected. */
static void test_aux_records(void **state)
{
    char dir[600], path[800];
    sub(dir, sizeof dir, "aux");
    tsr_store *s = NULL;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_store_create(dir, &s, &err), 0);
    char **names = NULL;
    size_t n = 9;
    assert_int_equal(tsr_store_aux_list(s, "ops", &names, &n, &err), 0); /* no sub yet */
    assert_int_equal(n, 0);
    assert_int_equal(tsr_store_aux_write(s, "ops", "b.pb", "second", 6, &err), 0);
    assert_int_equal(tsr_store_aux_write(s, "ops", "a.pb", "first", 5, &err), 0);
    assert_int_equal(tsr_store_aux_write(s, "ops", "a.pb", "FIRST!", 6, &err), 0);
    snprintf(path, sizeof path, "%s/ops/.tmp-c.pb", dir); /* an interrupted write */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("partial", f);
    fclose(f);
    assert_int_equal(tsr_store_aux_list(s, "ops", &names, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "a.pb");
    assert_string_equal(names[1], "b.pb");
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    assert_int_equal(access(path, F_OK), -1); /* the leftover is gone */
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(tsr_store_aux_read(s, "ops", "a.pb", 64, &buf, &len, &err), 0);
    assert_int_equal(len, 6);
    assert_memory_equal(buf, "FIRST!", 6);
    free(buf);
    assert_int_equal(tsr_store_aux_read(s, "ops", "a.pb", 5, &buf, &len, &err), TSR_ELIMIT);
    assert_non_null(strstr(err.msg, "a.pb"));
    assert_int_equal(tsr_store_aux_read(s, "ops", "zz.pb", 64, &buf, &len, &err),
                     TSR_ENOTFOUND);
    assert_int_equal(tsr_store_aux_write(s, "ops", "../x", "x", 1, &err), TSR_EINVAL);
    assert_int_equal(tsr_store_aux_write(s, "../ops", "x", "x", 1, &err), TSR_EINVAL);
    assert_int_equal(tsr_store_aux_write(s, "ops", ".hidden", "x", 1, &err), TSR_EINVAL);
    assert_int_equal(tsr_store_aux_remove(s, "ops", "a.pb", &err), 0);
    assert_int_equal(tsr_store_aux_remove(s, "ops", "a.pb", &err), 0); /* already gone */
    assert_int_equal(tsr_store_aux_list(s, "ops", &names, &n, &err), 0);
    assert_int_equal(n, 1);
    free(names[0]);
    free(names);
    uint64_t *vs = NULL;
    size_t nv = 9;
    assert_int_equal(tsr_store_list(s, &vs, &nv, &err), 0); /* "ops" is no version */
    assert_int_equal(nv, 0);
    free(vs);
    tsr_store_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manifest_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leftovers_and_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_current_switch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_at_every_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_random_kills, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enospc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_efbig, setup, teardown),
        cmocka_unit_test_setup_teardown(test_aux_records, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
