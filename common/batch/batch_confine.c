/*
 * batch_confine — keeps a server's batch reading inside the folders it allows
 * (tsr_batch_confine in batch.h; the walker's per-entry check, tsr__batch_entry_outside,
 * in batch_int.h).
 *
 * A batch_root named by a client is resolved with realpath (".." and every symlink
 * followed) and must lie inside one allowed folder (itself resolved when the server
 * started). Then every entry of the root and of its delete/ folder that is a symlink is
 * resolved too and must stay inside that same folder. A refusal names the allowed folders
 * and at most the name of the entry inside the root that points out: never the resolved
 * target, and never an entry of a folder outside the allowed ones (nothing outside is
 * listed: the root is opened only after it was found inside).
 *
 * A root that does not resolve (missing) is accepted only when its text, made absolute
 * and normalized lexically, is inside an allowed folder; the loader then reports it as
 * missing. Otherwise it is refused like a root outside, so a client cannot probe which
 * paths exist elsewhere.
 *
 * Limits (docs/security.md): a symlink swapped in after the check is caught again by the
 * walker (it runs the same per-entry check with the allowed folder, tsr_batch_options
 * .confine), but a rename between the walker's check and the reader's open is not; hard
 * links are not paths and are not detected (they cannot cross file systems, and
 * fs.protected_hardlinks stops links to files the linker does not own).
 */
#include "batch/batch.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "batch/batch_int.h"
#include "core/mem.h"

int tsr__batch_inside(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/')
        return path[0] == '/';
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

int tsr__batch_entry_outside(const char *dir, const char *name, const char *confine)
{
    char p[PATH_MAX];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p)
        return 1;
    if (lstat(p, &st) != 0)
        return 0; /* gone: the walker reports it */
    if (!S_ISLNK(st.st_mode))
        return 0; /* dir is inside, so a non-link entry is too */
    char *rp = realpath(p, NULL);
    int out = !rp || !tsr__batch_inside(rp, confine); /* a dangling link: refused */
    free(rp);
    return out;
}

/* "/a/./b//../c" -> "/a/c" into out (cap PATH_MAX). Returns 0, or -1 (not absolute, too
 * long). */
static int normalize(const char *in, char *out)
{
    if (in[0] != '/' || strlen(in) >= PATH_MAX)
        return -1;
    size_t o = 0;
    out[o++] = '/';
    const char *s = in;
    while (*s) {
        while (*s == '/')
            s++;
        size_t n = strcspn(s, "/");
        if (n == 0)
            break;
        if (n == 1 && s[0] == '.') {
        } else if (n == 2 && s[0] == '.' && s[1] == '.') {
            while (o > 1 && out[o - 1] != '/')
                o--;
            if (o > 1)
                o--; /* the slash before the dropped component */
        } else {
            if (o > 1)
                out[o++] = '/';
            memcpy(out + o, s, n);
            o += n;
        }
        s += n;
    }
    out[o] = '\0';
    return 0;
}

static int refuse(const char *const *allowed, size_t n, const char *entry, tsr_error *err)
{
    char list[700];
    size_t o = 0;
    list[0] = '\0';
    for (size_t i = 0; i < n && o < sizeof list; i++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", allowed[i]);
    if (entry)
        return tsr_err(err, TSR_EREJECTED, "batch_root entry '%.100s' resolves outside the "
                       "allowed folders (%s)", entry, list);
    return tsr_err(err, TSR_EREJECTED, "batch_root is not inside the allowed folders (%s)",
                   list);
}

/* Refuses the first symlink entry of dir (resolved, inside confine) that points out;
 * shown names are relative to the root (prefix "" or "delete/"). */
static int scan(const char *dir, const char *prefix, const char *confine,
                const char *const *allowed, size_t n, tsr_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0; /* the loader reports an unreadable root */
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (tsr__batch_entry_outside(dir, e->d_name, confine)) {
            char name[300];
            snprintf(name, sizeof name, "%s%s", prefix, e->d_name);
            rc = refuse(allowed, n, name, err);
        } else if (!*prefix && strcmp(e->d_name, "delete") == 0) {
            char sub[PATH_MAX];
            if (snprintf(sub, sizeof sub, "%s/delete", dir) < (int)sizeof sub)
                rc = scan(sub, "delete/", confine, allowed, n, err);
        }
    }
    closedir(d);
    return rc;
}

int tsr_batch_confine(const char *root, const char *const *allowed, size_t n, char **resolved,
                      const char **within, tsr_error *err)
{
    *resolved = NULL;
    *within = NULL;
    char *rp = realpath(root, NULL);
    if (!rp) {
        char lex[PATH_MAX];
        if (normalize(root, lex) == 0)
            for (size_t i = 0; i < n && !*within; i++)
                if (tsr__batch_inside(lex, allowed[i]))
                    *within = allowed[i];
        if (!*within)
            return refuse(allowed, n, NULL, err);
        *resolved = tsr_xstrdup(lex); /* missing: the loader says so */
        return 0;
    }
    for (size_t i = 0; i < n && !*within; i++)
        if (tsr__batch_inside(rp, allowed[i]))
            *within = allowed[i];
    if (!*within) {
        free(rp);
        return refuse(allowed, n, NULL, err);
    }
    int rc = scan(rp, "", *within, allowed, n, err);
    if (rc) {
        free(rp);
        *within = NULL;
        return rc;
    }
    *resolved = rp;
    return 0;
}
