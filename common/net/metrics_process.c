/*
 * metrics_process — process_* metrics from /proc/self (see metrics_process.h).
 *
 * Sources, as in the Prometheus Go client (procfs): /proc/self/stat fields 14 and 15
 * (utime, stime: clock ticks), 22 (starttime: ticks after boot), 23 (vsize: bytes), 24
 * (rss: pages); /proc/stat's `btime` (boot time, Unix seconds); the entries of
 * /proc/self/fd; the soft RLIMIT_NOFILE. Each render reads them afresh (a scrape every few
 * seconds costs three small reads and one directory listing).
 */
#include "net/metrics_process.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* /proc/self/stat fields after the command name's closing ')': field 3 is index 0. */
#define STAT_UTIME 11
#define STAT_STIME 12
#define STAT_STARTTIME 19
#define STAT_VSIZE 20
#define STAT_RSS 21
#define STAT_NEED 22

struct proc_stat {
    unsigned long long utime, stime, starttime, vsize, rss;
};

/* Reads /proc/self/stat. Returns 0, or -1 when it cannot be read or parsed. */
static int read_stat(struct proc_stat *ps)
{
    char buf[2048];
    FILE *f = fopen("/proc/self/stat", "re");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p)
        return -1;
    unsigned long long v[STAT_NEED];
    int i = 0;
    for (char *save = NULL, *tok = strtok_r(p + 1, " \n", &save); tok && i < STAT_NEED;
         tok = strtok_r(NULL, " \n", &save), i++)
        v[i] = strtoull(tok, NULL, 10);
    if (i < STAT_NEED)
        return -1;
    ps->utime = v[STAT_UTIME];
    ps->stime = v[STAT_STIME];
    ps->starttime = v[STAT_STARTTIME];
    ps->vsize = v[STAT_VSIZE];
    ps->rss = v[STAT_RSS];
    return 0;
}

/* Boot time in Unix seconds from /proc/stat, or -1. */
static long long boot_time(void)
{
    FILE *f = fopen("/proc/stat", "re");
    if (!f)
        return -1;
    char line[512];
    long long bt = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "btime ", 6) == 0) {
            bt = strtoll(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return bt;
}

/* Entries of /proc/self/fd (the listing's own descriptor included, as procfs counts), or -1. */
static long open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static void put(tsr_buf *b, const char *name, const char *type, const char *help, double v)
{
    tsr_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

void tsr_metrics_process_render(tsr_buf *b)
{
    struct proc_stat ps;
    long tck = sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    if (read_stat(&ps) == 0 && tck > 0 && page > 0) {
        put(b, "process_cpu_seconds_total", "counter",
            "Total user and system CPU time spent in seconds.",
            (double)(ps.utime + ps.stime) / (double)tck);
        put(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
            (double)ps.rss * (double)page);
        put(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
            (double)ps.vsize);
        long long bt = boot_time();
        if (bt > 0)
            put(b, "process_start_time_seconds", "gauge",
                "Start time of the process since unix epoch in seconds.",
                (double)bt + (double)ps.starttime / (double)tck);
    }
    long fds = open_fds();
    if (fds >= 0)
        put(b, "process_open_fds", "gauge", "Number of open file descriptors.", (double)fds);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        put(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
            (double)rl.rlim_cur);
}
