/* What a lane gives up before it reads its first camera byte, whether or not systemd started the daemon:
 * its uid (when started as root), every capability, new privileges (no_new_privs), and every system call that
 * the lane does not make (a seccomp filter, built with libseccomp). Daemon-only: no vendor includes this.
 *
 * Call from a single-threaded process (a freshly forked lane): capabilities, uids and the filter then hold
 * for every thread it starts afterwards. */
#ifndef EDGEINFER_HARDEN_H
#define EDGEINFER_HARDEN_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <seccomp.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <termios.h>
#include <unistd.h>

#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#endif

/* Lets an unprivileged thread take a real-time priority up to `priority` (RLIMIT_RTPRIO), so the lane needs no
 * CAP_SYS_NICE for its loop. Raises the hard limit only where it may (root); returns the soft limit now set. */
static int ei_allow_rtprio(int priority)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_RTPRIO, &rl) != 0)
        return -errno;
    if (rl.rlim_cur >= (rlim_t)priority)
        return (int)rl.rlim_cur;
    struct rlimit want = {(rlim_t)priority, rl.rlim_max >= (rlim_t)priority ? rl.rlim_max : (rlim_t)priority};
    if (setrlimit(RLIMIT_RTPRIO, &want) != 0) {
        want.rlim_max = rl.rlim_max;
        want.rlim_cur = rl.rlim_max;  /* as high as this process may go */
        if (setrlimit(RLIMIT_RTPRIO, &want) != 0)
            return -errno;
    }
    return (int)want.rlim_cur;
}

#define EI_NICE_MASK (1u << CAP_SYS_NICE)
#define EI_SETPCAP_MASK (1u << CAP_SETPCAP)

/* Sets every capability set of the calling thread to CAP_SYS_NICE (keep_nice, if it has it) or to nothing, and
 * no_new_privs. A thread that still holds CAP_SETPCAP (kept by ei_become beside CAP_SYS_NICE) first empties its
 * bounding set with it, so that a lane ends with CapBnd 0 as well.
 * Capabilities are per thread: a thread started afterwards inherits what its creator has then. 0 or -errno. */
static int ei_limit_capabilities(int keep_nice)
{
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        return -errno;
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct now[2];
    if (syscall(SYS_capget, &hdr, now) != 0)
        return -errno;
    if (!keep_nice && (now[0].effective & EI_SETPCAP_MASK))
        for (int cap = 0; cap <= CAP_LAST_CAP; cap++)
            if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
                return -errno;
    __u32 keep = keep_nice ? (now[0].permitted & (EI_NICE_MASK | EI_SETPCAP_MASK)) : 0;  /* never more than it has */
    struct __user_cap_data_struct data[2] = {{keep, keep, 0}, {0, 0, 0}};
    if (syscall(SYS_capset, &hdr, data) != 0)
        return -errno;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -errno;
    return 0;
}

/* Root only: empties the bounding set (but CAP_SYS_NICE and CAP_SETPCAP if keep_nice) and the supplementary groups,
 * then takes (uid, gid) as real, effective and saved ids, keeping at most CAP_SYS_NICE and CAP_SETPCAP (with which
 * each thread empties its bounding set when it lets CAP_SYS_NICE go: ei_limit_capabilities(0)). 0 or -errno. */
static int ei_become(uid_t uid, gid_t gid, int keep_nice)
{
    for (int cap = 0; cap <= CAP_LAST_CAP; cap++)
        if (!(keep_nice && (cap == CAP_SYS_NICE || cap == CAP_SETPCAP)) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
            return -errno;
    if (setgroups(0, NULL) != 0)
        return -errno;
    if (keep_nice && prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0)
        return -errno;
    if (setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0)
        return -errno;
    if (keep_nice && prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0)
        return -errno;
    if (getuid() != uid || geteuid() != uid || getgid() != gid || getegid() != gid)
        return -EPERM;
    return ei_limit_capabilities(keep_nice);
}

/* The ioctl commands a lane makes (traced: strace -f -e trace=ioctl on a serving daemon), all on its own fds and
 * none that writes to a terminal: isatty (TCGETS), the terminal's size (TIOCGWINSZ), bytes waiting (FIONREAD),
 * blocking or not (FIONBIO) and close-on-exec (FIOCLEX, FIONCLEX: CPython's os.set_inheritable). */
static const unsigned int ei_lane_ioctls[] = {TCGETS, TIOCGWINSZ, FIONREAD, FIONBIO, FIOCLEX, FIONCLEX};

/* The system calls a lane makes (traced: a lane's whole life, sessions built and swapped, streams attached and
 * detached, runs cancelled), each allowed as such; everything else fails with EPERM. Narrowed further:
 *  - clone only for threads, with no namespace flag; clone3 answers ENOSYS (its flags sit behind a pointer that
 *    a filter cannot read), so glibc falls back to clone;
 *  - openat only to read; nothing that creates, writes, renames or removes a file;
 *  - no socket of its own (it answers on the one it was forked with), no exec, no ptrace, no other process's
 *    memory, no signal to another process, no namespaces, no mounts, no keyrings, no BPF, no io_uring;
 *  - write-and-execute memory refused as systemd's MemoryDenyWriteExecute= refuses it; except with `jit`, a lane
 *    whose model runs on a provider that compiles its kernels at run time (OpenVINO: its CPU plugin's Xbyak code
 *    buffers are mprotect()ed read+write+execute, 256 KiB each, traced): mprotect then takes any protection
 *    (docs/decisions/0038-execution-providers.md says what that gives up and where);
 *  - ioctl only for the commands a lane makes (ei_lane_ioctls), compared as the kernel reads them, by their low
 *    32 bits: TIOCSTI (typing into a terminal), TIOCLINUX and every other command fail, whatever the upper bits;
 *  - prctl only to name a thread or a mapping, to read, or to give up (capabilities, new privileges);
 *  - scheduling policy, priority and CPU affinity set for the calling thread only (pid 0): never for another lane's
 *    thread. ONNX Runtime's pool threads, which would pin themselves by their tid, are pinned by inheritance
 *    instead (models/runtime.py: created while the creating thread has their CPUs).
 * 0 or -errno. */
static int ei_install_lane_filter(pid_t self, int jit)
{
    static const int plain[] = {
        SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(readv), SCMP_SYS(writev), SCMP_SYS(pread64), SCMP_SYS(pwrite64),
        SCMP_SYS(close), SCMP_SYS(close_range), SCMP_SYS(fstat), SCMP_SYS(newfstatat), SCMP_SYS(statx),
        SCMP_SYS(fstatfs), SCMP_SYS(statfs), SCMP_SYS(lseek), SCMP_SYS(fcntl), SCMP_SYS(dup), SCMP_SYS(dup2),
        SCMP_SYS(dup3), SCMP_SYS(access), SCMP_SYS(faccessat), SCMP_SYS(faccessat2), SCMP_SYS(readlink),
        SCMP_SYS(readlinkat), SCMP_SYS(getdents64), SCMP_SYS(getcwd), SCMP_SYS(fadvise64),
        SCMP_SYS(munmap), SCMP_SYS(mremap), SCMP_SYS(madvise), SCMP_SYS(brk), SCMP_SYS(mincore), SCMP_SYS(msync),
        SCMP_SYS(membarrier),
        SCMP_SYS(rt_sigaction), SCMP_SYS(rt_sigprocmask), SCMP_SYS(rt_sigreturn), SCMP_SYS(sigaltstack),
        SCMP_SYS(rt_sigtimedwait), SCMP_SYS(restart_syscall),
        SCMP_SYS(futex), SCMP_SYS(futex_waitv), SCMP_SYS(set_robust_list), SCMP_SYS(get_robust_list),
        SCMP_SYS(rseq), SCMP_SYS(set_tid_address), SCMP_SYS(exit), SCMP_SYS(exit_group),
        SCMP_SYS(nanosleep), SCMP_SYS(clock_nanosleep), SCMP_SYS(clock_gettime), SCMP_SYS(clock_getres),
        SCMP_SYS(gettimeofday), SCMP_SYS(time), SCMP_SYS(times), SCMP_SYS(getrusage), SCMP_SYS(sysinfo),
        SCMP_SYS(uname), SCMP_SYS(getrandom), SCMP_SYS(getcpu),
        SCMP_SYS(getpid), SCMP_SYS(getppid), SCMP_SYS(gettid), SCMP_SYS(getuid), SCMP_SYS(geteuid),
        SCMP_SYS(getgid), SCMP_SYS(getegid), SCMP_SYS(getgroups), SCMP_SYS(getresuid), SCMP_SYS(getresgid),
        SCMP_SYS(capget), SCMP_SYS(capset) /* only ever lowers: nothing is left to raise */, SCMP_SYS(getrlimit), SCMP_SYS(getpriority),
        SCMP_SYS(sched_yield), SCMP_SYS(sched_getaffinity),
        SCMP_SYS(sched_getscheduler), SCMP_SYS(sched_getparam), SCMP_SYS(sched_getattr),
        SCMP_SYS(sched_get_priority_max), SCMP_SYS(sched_get_priority_min),
        SCMP_SYS(poll), SCMP_SYS(ppoll), SCMP_SYS(select), SCMP_SYS(pselect6), SCMP_SYS(epoll_create1),
        SCMP_SYS(epoll_ctl), SCMP_SYS(epoll_wait), SCMP_SYS(epoll_pwait), SCMP_SYS(eventfd2), SCMP_SYS(pipe2),
        SCMP_SYS(sendmsg), SCMP_SYS(recvmsg), SCMP_SYS(sendto), SCMP_SYS(recvfrom), SCMP_SYS(shutdown),
        SCMP_SYS(getsockname), SCMP_SYS(getpeername), SCMP_SYS(getsockopt), SCMP_SYS(setsockopt),
        SCMP_SYS(arch_prctl),
    };
    int rc;
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
    if (ctx == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, plain[i], 0)) != 0)
            goto out;
    const scmp_datum_t ns = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
                            CLONE_NEWPID | CLONE_NEWNET;
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD | ns, CLONE_THREAD))) != 0)
        goto out;
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0)) != 0)
        goto out;
    const scmp_datum_t writing = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND;
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(openat), 1,
                               SCMP_A2(SCMP_CMP_MASKED_EQ, writing, 0))) != 0)
        goto out;
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mmap), 1,
                               SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, PROT_WRITE))) != 0 ||
        (rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mmap), 1,
                               SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_WRITE, 0))) != 0)
        goto out;
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mprotect), 1,
                               SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0))) != 0)
        goto out;
    if (jit && (rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mprotect), 0)) != 0)
        goto out;
    /* The kernel takes an ioctl's command as 32 bits: compared by those alone, so that no upper bit sneaks one by. */
    for (size_t i = 0; i < sizeof ei_lane_ioctls / sizeof ei_lane_ioctls[0]; i++)
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1,
                                   SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, ei_lane_ioctls[i]))) != 0)
            goto out;
    static const int prctl_ok[] = {PR_SET_NAME, PR_GET_NAME, PR_GET_DUMPABLE, PR_GET_NO_NEW_PRIVS, PR_GET_SECCOMP,
                                   PR_CAPBSET_READ, PR_GET_TIMERSLACK, PR_GET_PDEATHSIG, PR_SET_VMA,
                                   PR_CAP_AMBIENT, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP};
    for (size_t i = 0; i < sizeof prctl_ok / sizeof prctl_ok[0]; i++)
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1,
                                   SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)prctl_ok[i]))) != 0)
            goto out;
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(tgkill), 1, SCMP_A0(SCMP_CMP_EQ, self))) != 0 ||
        (rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(kill), 1, SCMP_A0(SCMP_CMP_EQ, self))) != 0)
        goto out;
    /* Scheduling policy, priority and CPUs: of the calling thread only (pid 0). */
    static const int own[] = {SCMP_SYS(sched_setscheduler), SCMP_SYS(sched_setparam), SCMP_SYS(sched_setattr),
                              SCMP_SYS(sched_setaffinity)};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, own[i], 1, SCMP_A0(SCMP_CMP_EQ, 0))) != 0)
            goto out;
    /* Read a resource limit, never set one. */
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prlimit64), 1, SCMP_A2(SCMP_CMP_EQ, 0))) != 0)
        goto out;
    rc = seccomp_load(ctx);
out:
    seccomp_release(ctx);
    return rc;
}

#endif
