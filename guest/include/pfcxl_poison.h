/*
 * pfcxl_poison.h: a CXL memdev's poison list as the guest's `cxl list -M -L` reports it (ndctl;
 * tracefs mounted at /sys/kernel/tracing). QEMU's poison leaves the bytes as they were, so a
 * reader must ask the device. Include after pfcxl_tool.h (die). The Python side is
 * guest/python/pfcxl_poison.py.
 */
#ifndef PFCXL_POISON_H
#define PFCXL_POISON_H

#include <poll.h>
#include <sys/wait.h>

#define POISON_MAX 256
static uint64_t g_poison[POISON_MAX][2]; /* device offset, length */
static int g_npoison = -1;               /* -1: not consulted */

/* The number after `"name"` and its colon at p (JSON whitespace allowed); *end past it. */
static uint64_t json_number(char *p, const char *name, char **end)
{
    p += strlen(name) + 2;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ':')
        p++;
    return strtoull(p, end, 10);
}

/* `cxl list -M -L`'s output into text[room] (NUL-terminated), waiting at most timeout_s seconds:
 * the listing goes through the device's mailbox and the kernel's trace buffer, and a reader must
 * not wait for ever on a device that does not answer (nor on output it has no room for). */
static void run_cxl_list(char *text, size_t room, uint64_t timeout_s)
{
    int fds[2];
    if (pipe(fds) != 0)
        die("cannot run cxl list: %s", strerror(errno));
    const pid_t pid = fork();
    if (pid < 0)
        die("cannot run cxl list: %s", strerror(errno));
    if (pid == 0) {
        dup2(fds[1], 1);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 2);
        close(fds[0]);
        close(fds[1]);
        execlp("cxl", "cxl", "list", "-M", "-L", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    const uint64_t deadline = now_ns() + timeout_s * 1000000000ULL;
    int status = 0, over = 0;
    for (;;) {
        const uint64_t now = now_ns();
        struct pollfd p = {fds[0], POLLIN, 0};
        const int ready = now < deadline ? poll(&p, 1, (int)((deadline - now) / 1000000 + 1)) : 0;
        if (ready == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            die("cxl list -M -L did not answer within %" PRIu64 " s (the device's poison list is unknown; "
                "--poison-timeout sets the wait)", timeout_s);
        }
        if (ready < 0 && errno == EINTR)
            continue;
        char sink[4096];
        const ssize_t got = n + 1 < room ? read(fds[0], text + n, room - 1 - n) : read(fds[0], sink, sizeof sink);
        if (got <= 0)
            break;
        if (n + 1 < room)
            n += (size_t)got;
        else
            over = 1; /* drained, so that it can finish */
    }
    close(fds[0]);
    text[n] = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("cxl list -M -L failed (is tracefs mounted at /sys/kernel/tracing?)");
    if (over)
        die("cxl list -M -L printed more than %zu bytes", room - 1);
}

/* The media errors `cxl list -M -L` reports for the memdev whose serial is `serial`. */
static void load_poison(uint64_t serial, uint64_t timeout_s)
{
    static char text[1 << 20];
    run_cxl_list(text, sizeof text, timeout_s);
    char *dev = text, *end;
    while ((dev = strstr(dev, "\"serial\"")) && json_number(dev, "serial", &end) != serial)
        dev = end;
    if (!dev)
        die("no memdev with serial %" PRIu64 " in cxl list", serial);
    char *start = dev, *stop = strstr(dev, "\"memdev\""); /* this memdev's object only */
    while (start > text && strncmp(start, "\"memdev\"", 8) != 0)
        start--;
    if (stop)
        *stop = 0;
    g_npoison = 0;
    for (char *p = strstr(start, "\"media_errors\""); p && (p = strstr(p, "\"offset\"")); p = end) {
        if (g_npoison == POISON_MAX)
            die("more than %d poisoned ranges", POISON_MAX);
        g_poison[g_npoison][0] = json_number(p, "offset", &end);
        char *len = strstr(end, "\"length\"");
        if (!len)
            break;
        g_poison[g_npoison++][1] = json_number(len, "length", &end);
    }
}

#endif
