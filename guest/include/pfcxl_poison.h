/*
 * pfcxl_poison.h: a CXL memdev's poison list as the guest's `cxl list -M -L` reports it (ndctl;
 * tracefs mounted at /sys/kernel/tracing). QEMU's poison leaves the bytes as they were, so a
 * reader must ask the device. Include after pfcxl_tool.h (die). The Python side is
 * guest/python/pfcxl_poison.py.
 */
#ifndef PFCXL_POISON_H
#define PFCXL_POISON_H

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

/* The media errors `cxl list -M -L` reports for the memdev whose serial is `serial`. */
static void load_poison(uint64_t serial)
{
    FILE *f = popen("cxl list -M -L 2>/dev/null", "r");
    if (!f)
        die("cannot run cxl list: %s", strerror(errno));
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    if (pclose(f) != 0)
        die("cxl list -M -L failed (is tracefs mounted at /sys/kernel/tracing?)");
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
