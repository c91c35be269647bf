/* The pod sandbox's process for the tests' locally built pause image: holds the pod's namespaces open
 * until the runtime stops it (SIGTERM or SIGINT), and reaps any child re-parented to it, since it is
 * PID 1 when the sandbox has its own PID namespace. Built static so the image needs no libc. */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stopping;

static void on_stop(int sig) {
    (void)sig;
    stopping = 1;
}

static void on_child(int sig) {
    (void)sig;
    int saved = errno; /* waitpid may clobber errno under the interrupted code */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

int main(void) {
    struct sigaction stop = {0}, child = {0};
    stop.sa_handler = on_stop;
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    if (sigaction(SIGTERM, &stop, NULL) < 0 || sigaction(SIGINT, &stop, NULL) < 0 ||
        sigaction(SIGCHLD, &child, NULL) < 0) {
        return 1;
    }
    /* SIGTERM/SIGINT stay blocked except inside sigsuspend, so one arriving between the check and the
     * wait is delivered there instead of being lost (pause() alone would sleep through it). */
    sigset_t block, waitmask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    if (sigprocmask(SIG_BLOCK, &block, &waitmask) < 0) {
        return 1;
    }
    sigdelset(&waitmask, SIGTERM);
    sigdelset(&waitmask, SIGINT);
    while (!stopping) {
        sigsuspend(&waitmask); /* returns after each handled signal; a SIGCHLD must not end the sandbox */
    }
    return 0;
}
