/* A SIGBUS handler for pfcxl's host tools that map a pool file (host_tools/bus_error.py).
 *
 * A page of a shared file mapping that its file system cannot supply (a full tmpfs, a file cut
 * short under the mapping) raises SIGBUS in the process touching it. Python cannot handle it:
 * its handler only sets a flag, the faulting copy runs again and faults again. This handler
 * writes the one line the tool prepared (naming the file and its file system) and exits with
 * the tool's status. write(2) and _exit(2) are async-signal-safe; nothing else is called.
 */
#include <signal.h>
#include <string.h>
#include <unistd.h>

static char line[4096];
static size_t line_length;
static int exit_status = 1;

static void on_bus_error(int sig)
{
    (void)sig;
    size_t done = 0;
    while (done < line_length) {
        ssize_t n = write(STDERR_FILENO, line + done, line_length - done);
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    _exit(exit_status);
}

/* From now on a SIGBUS prints `message` to stderr and exits with `status`. 0, or -1 (errno). */
int pfcxl_bus_error_guard(const char *message, int status)
{
    struct sigaction action;
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);          /* the handler never sees a half-copied line */
    size_t n = strlen(message);
    if (n >= sizeof line)
        n = sizeof line - 1;
    memcpy(line, message, n);
    line_length = n;
    exit_status = status;
    sigprocmask(SIG_SETMASK, &old, NULL);
    memset(&action, 0, sizeof action);
    action.sa_handler = on_bus_error;
    sigemptyset(&action.sa_mask);
    return sigaction(SIGBUS, &action, NULL);
}
