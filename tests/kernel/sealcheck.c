/*
 * sealcheck.c - probe sealed-memfd and futex facts the edgeinfer design relies on.
 *
 * Build:  gcc -O2 -Wall -static -o sealcheck sealcheck.c
 * Run:    as root on a host (uses /dev/shm for the tmpfs check), or as /init
 *         in an initramfs (PID 1: mounts devtmpfs, proc and a tmpfs itself,
 *         prints to /dev/console and powers the machine off at the end).
 *
 * Output: one line per fact:  "<PASS|FAIL|INFO|SKIP> <id> <text>".
 * PASS/FAIL compare against the expectation written in the line
 * ("expect ..."); INFO lines only report values/measurements.
 * Must run as root (it drops a forked child to uid/gid 65534).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/magic.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <grp.h>

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif
#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif
#ifndef MADV_REMOVE
#define MADV_REMOVE 9
#endif

/* futex2 / futex_waitv (Linux 5.16+, syscall 449 on x86_64) */
#define SYS_futex_waitv_nr 449
#define FUTEX2_SIZE_U32_ 0x02
#define FUTEX2_PRIVATE_ 128
struct futex_waitv_ {
	uint64_t val;
	uint64_t uaddr;
	uint32_t flags;
	uint32_t __reserved;
};

#define MIB (1024 * 1024)
#define RING_SIZE MIB
#define NOBODY 65534

static int g_pid1;

/* ------------------------------------------------------------------ output */

static const char *ename(int e)
{
	const char *n = strerrorname_np(e);
	return n ? n : "E?";
}

static void line(const char *tag, const char *id, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	printf("%-4s %-5s %s\n", tag, id, buf);
	fflush(stdout);
}

/* Result of a syscall-ish call: "ret=R" or "ret=-1 errno=EPERM (Operation not permitted)" */
static const char *res(long ret, int err)
{
	static char buf[8][160];
	static int i;
	char *b = buf[i++ & 7];
	if (ret == -1)
		snprintf(b, 160, "ret=-1 errno=%s (%s)", ename(err), strerror(err));
	else
		snprintf(b, 160, "ret=%ld", ret);
	return b;
}

/* expect failure with errno want */
static void expect_err(const char *id, const char *what, long ret, int err, int want)
{
	int ok = (ret == -1 && err == want);
	line(ok ? "PASS" : "FAIL", id, "%s -> %s [expect -1/%s]", what, res(ret, err), ename(want));
}

/* expect success (ret != -1) */
static void expect_ok(const char *id, const char *what, long ret, int err)
{
	line(ret != -1 ? "PASS" : "FAIL", id, "%s -> %s [expect success]", what, res(ret, err));
}

/* same for mmap (MAP_FAILED) */
static void *mmap_chk(const char *id, const char *what, int expect_success, int want_errno,
		      size_t len, int prot, int flags, int fd)
{
	errno = 0;
	void *p = mmap(NULL, len, prot, flags, fd, 0);
	int e = errno;
	if (expect_success) {
		line(p != MAP_FAILED ? "PASS" : "FAIL", id, "%s -> %s [expect success]", what,
		     p != MAP_FAILED ? "mapped" : res(-1, e));
	} else {
		int ok = (p == MAP_FAILED && e == want_errno);
		line(ok ? "PASS" : "FAIL", id, "%s -> %s [expect -1/%s]", what,
		     p != MAP_FAILED ? "mapped (UNEXPECTED)" : res(-1, e), ename(want_errno));
	}
	return p;
}

static void seals_str(int s, char *buf, size_t n)
{
	if (s < 0) {
		snprintf(buf, n, "-1");
		return;
	}
	snprintf(buf, n, "0x%x(%s%s%s%s%s)", s, (s & F_SEAL_SEAL) ? "SEAL " : "",
		 (s & F_SEAL_SHRINK) ? "SHRINK " : "", (s & F_SEAL_GROW) ? "GROW " : "",
		 (s & F_SEAL_WRITE) ? "WRITE " : "", (s & F_SEAL_FUTURE_WRITE) ? "FUTURE_WRITE " : "");
	/* trim trailing blank inside parens */
	char *p = strstr(buf, " )");
	if (p)
		memmove(p, p + 1, strlen(p + 1) + 1);
}

/* ------------------------------------------------------------------ helpers */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static long futex(volatile uint32_t *uaddr, int op, uint32_t val, const struct timespec *to)
{
	return syscall(SYS_futex, uaddr, op, val, to, NULL, 0);
}

static int drop_to_nobody(void)
{
	if (setgroups(0, NULL) != 0 && errno != EPERM)
		return -1;
	if (setgid(NOBODY) != 0)
		return -1;
	if (setuid(NOBODY) != 0)
		return -1;
	return 0;
}

static int have_proc(void)
{
	return access("/proc/self/fd", F_OK) == 0;
}

static void xwrite1(int fd, char c)
{
	if (write(fd, &c, 1) != 1) {
		perror("pipe write");
		_exit(99);
	}
}

static char xread1(int fd)
{
	char c = 0;
	if (read(fd, &c, 1) != 1) {
		perror("pipe read");
		_exit(98);
	}
	return c;
}

/* ------------------------------------------------------------------ fact 1 */

static void fact1(void)
{
	char sb[128];
	int fd = memfd_create("ei-fact1", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int e = errno;
	expect_ok("1.a", "memfd_create(\"ei-fact1\", MFD_CLOEXEC|MFD_ALLOW_SEALING)", fd, e);
	if (fd < 0)
		return;

	int r = ftruncate(fd, RING_SIZE);
	e = errno;
	expect_ok("1.b", "ftruncate(memfd, 1 MiB)", r, e);
	r = fallocate(fd, 0, 0, RING_SIZE);
	e = errno;
	expect_ok("1.c", "fallocate(memfd, 0, 0, 1 MiB)", r, e);

	char *m = mmap_chk("1.d", "mmap(PROT_READ|PROT_WRITE, MAP_SHARED, 1 MiB)", 1, 0, RING_SIZE,
			   PROT_READ | PROT_WRITE, MAP_SHARED, fd);
	if (m != MAP_FAILED)
		memset(m, 0xAB, 4096);

	r = fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	e = errno;
	expect_ok("1.e", "F_ADD_SEALS SHRINK|GROW|SEAL while writable MAP_SHARED mapping exists", r, e);

	if (m != MAP_FAILED) {
		m[100] = 0x5A;
		line(m[100] == 0x5A ? "PASS" : "FAIL", "1.f",
		     "existing RW mapping still writable after SHRINK|GROW|SEAL [expect yes]");
	}

	r = ftruncate(fd, RING_SIZE / 2);
	e = errno;
	expect_err("1.g", "ftruncate(memfd, 512 KiB) (shrink)", r, e, EPERM);
	r = ftruncate(fd, 2 * RING_SIZE);
	e = errno;
	expect_err("1.h", "ftruncate(memfd, 2 MiB) (grow)", r, e, EPERM);
	r = ftruncate(fd, RING_SIZE);
	e = errno;
	line("INFO", "1.i", "ftruncate(memfd, 1 MiB) (same size) -> %s", res(r, e));
	r = fallocate(fd, 0, 0, 2 * RING_SIZE);
	e = errno;
	expect_err("1.j", "fallocate(memfd, 0, 0, 2 MiB) (grow)", r, e, EPERM);
	{
		char b[16] = "hello";
		long w = pwrite(fd, b, sizeof b, 0);
		e = errno;
		expect_ok("1.k", "pwrite(memfd, 16 B, off 0) (inside size, no WRITE seal)", w, e);
		w = pwrite(fd, b, sizeof b, RING_SIZE - 8);
		e = errno;
		line(w == 8 ? "PASS" : "FAIL", "1.l",
		     "pwrite(16 B at size-8) crossing EOF with GROW seal -> %s [expect short write 8]", res(w, e));
	}

	r = fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE);
	e = errno;
	expect_err("1.m", "F_ADD_SEALS F_SEAL_WRITE after F_SEAL_SEAL", r, e, EPERM);

	int s = fcntl(fd, F_GET_SEALS);
	e = errno;
	seals_str(s, sb, sizeof sb);
	line(s == (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW) ? "PASS" : "FAIL", "1.n",
	     "F_GET_SEALS -> %s%s [expect 0x7(SEAL SHRINK GROW)]", sb, s < 0 ? res(-1, e) : "");

	struct stat st;
	if (fstat(fd, &st) == 0)
		line("INFO", "1.o", "fstat(memfd): st_nlink=%lu st_mode=0%o st_uid=%u st_size=%lld st_blocks=%lld",
		     (unsigned long)st.st_nlink, st.st_mode, st.st_uid, (long long)st.st_size,
		     (long long)st.st_blocks);
	else
		line("FAIL", "1.o", "fstat(memfd) -> %s", res(-1, errno));

	struct statfs sf;
	if (fstatfs(fd, &sf) == 0)
		line((unsigned long)sf.f_type == TMPFS_MAGIC ? "PASS" : "FAIL", "1.p",
		     "fstatfs(memfd).f_type=0x%lx [expect TMPFS_MAGIC 0x01021994]", (unsigned long)sf.f_type);
	else
		line("FAIL", "1.p", "fstatfs(memfd) -> %s", res(-1, errno));

	if (have_proc()) {
		char path[64], tgt[PATH_MAX];
		snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
		ssize_t n = readlink(path, tgt, sizeof tgt - 1);
		if (n >= 0) {
			tgt[n] = 0;
			line("INFO", "1.q", "readlink(%s) = \"%s\"", path, tgt);
		} else
			line("FAIL", "1.q", "readlink(%s) -> %s", path, res(-1, errno));
	} else
		line("SKIP", "1.q", "readlink(/proc/self/fd/N): /proc not available");

	/* Extra: F_SEAL_WRITE (not FUTURE_WRITE) while a writable shared mapping exists */
	{
		int fd2 = memfd_create("ei-fact1x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd2 >= 0 && ftruncate(fd2, 4096) == 0) {
			void *m2 = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
			r = fcntl(fd2, F_ADD_SEALS, F_SEAL_WRITE);
			e = errno;
			expect_err("1.x", "extra: F_ADD_SEALS F_SEAL_WRITE while writable MAP_SHARED mapping exists",
				   r, e, EBUSY);
			if (m2 != MAP_FAILED)
				munmap(m2, 4096);
			r = fcntl(fd2, F_ADD_SEALS, F_SEAL_WRITE);
			e = errno;
			expect_ok("1.y", "extra: F_ADD_SEALS F_SEAL_WRITE after munmap of that mapping", r, e);
		}
		if (fd2 >= 0)
			close(fd2);
	}
	/* Extra: memfd without MFD_ALLOW_SEALING */
	{
		int fd3 = memfd_create("ei-nosealing", MFD_CLOEXEC);
		if (fd3 >= 0) {
			s = fcntl(fd3, F_GET_SEALS);
			seals_str(s, sb, sizeof sb);
			line(s == F_SEAL_SEAL ? "PASS" : "FAIL", "1.z",
			     "extra: memfd_create without MFD_ALLOW_SEALING: F_GET_SEALS -> %s [expect 0x1(SEAL)]", sb);
			close(fd3);
		}
	}

	if (m != MAP_FAILED)
		munmap(m, RING_SIZE);
	close(fd);
}

/* ------------------------------------------------------------------ fact 2 */

static void fact2(const char *dir)
{
	char path[256], sb[128];
	snprintf(path, sizeof path, "%s/sealcheck-plain", dir);
	struct statfs sf;
	if (statfs(dir, &sf) == 0)
		line((unsigned long)sf.f_type == TMPFS_MAGIC ? "INFO" : "FAIL", "2.a",
		     "statfs(%s).f_type=0x%lx (tmpfs=0x01021994)", dir, (unsigned long)sf.f_type);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		line("FAIL", "2.b", "open(%s, O_CREAT) -> %s", path, res(-1, errno));
		return;
	}
	if (ftruncate(fd, 4096) != 0)
		line("FAIL", "2.b", "ftruncate(%s) -> %s", path, res(-1, errno));
	int s = fcntl(fd, F_GET_SEALS);
	int e = errno;
	seals_str(s, sb, sizeof sb);
	line(s == F_SEAL_SEAL ? "PASS" : "FAIL", "2.c", "plain tmpfs file %s: F_GET_SEALS -> %s%s [expect 0x1(SEAL)]",
	     path, sb, s < 0 ? res(-1, e) : "");
	int r = fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
	e = errno;
	expect_err("2.d", "plain tmpfs file: F_ADD_SEALS F_SEAL_SHRINK", r, e, EPERM);
	close(fd);
	unlink(path);
}

/* ------------------------------------------------------------------ fact 3 */

/* layout of the 1 MiB "result ring" used for the futex tests */
struct ringhdr {
	volatile uint32_t w_wait;   /* FUTEX_WAIT word (child waits) */
	volatile uint32_t w_v1;     /* futex_waitv word 0 */
	volatile uint32_t w_v2;     /* futex_waitv word 1 */
	volatile uint32_t w_k;      /* word the parent waits on, child wakes */
	volatile uint32_t w_to;     /* never woken: timeout test */
	uint32_t pad;
	volatile uint64_t t_wake;   /* parent's CLOCK_MONOTONIC just before FUTEX_WAKE */
};
#define COW_OFF 8192 /* byte used for the MAP_PRIVATE copy-on-write test */

static void child_mutation_tests(const char *pfx, int fd, int include_cow, volatile const char *ro_view)
{
	char id[16];
	int r, e;

	/* b: RW shared mapping */
	snprintf(id, sizeof id, "%sb", pfx);
	void *p = mmap_chk(id, "mmap(PROT_READ|PROT_WRITE, MAP_SHARED)", 0, EPERM, RING_SIZE,
			   PROT_READ | PROT_WRITE, MAP_SHARED, fd);
	if (p != MAP_FAILED)
		munmap(p, RING_SIZE);

	/* c: mprotect a read-only shared mapping to RW */
	snprintf(id, sizeof id, "%sc", pfx);
	p = mmap(NULL, RING_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		line("FAIL", id, "mmap(PROT_READ, MAP_SHARED) for mprotect test -> %s", res(-1, errno));
	} else {
		r = mprotect(p, RING_SIZE, PROT_READ | PROT_WRITE);
		e = errno;
		expect_err(id, "mprotect(RO MAP_SHARED mapping, PROT_READ|PROT_WRITE)", r, e, EACCES);
		r = mprotect(p, RING_SIZE, PROT_READ | PROT_EXEC);
		e = errno;
		line("INFO", id, "(extra) mprotect(RO MAP_SHARED mapping, PROT_READ|PROT_EXEC) -> %s", res(r, e));
		munmap(p, RING_SIZE);
	}

	/* d: write/pwrite */
	char buf[8] = "evil";
	snprintf(id, sizeof id, "%sd", pfx);
	long w = pwrite(fd, buf, 4, 0);
	e = errno;
	expect_err(id, "pwrite(fd, 4 B, off 0)", w, e, EPERM);
	lseek(fd, 0, SEEK_SET);
	w = write(fd, buf, 4);
	e = errno;
	expect_err(id, "write(fd, 4 B)", w, e, EPERM);

	/* e: ftruncate / fallocate punch hole */
	snprintf(id, sizeof id, "%se", pfx);
	r = ftruncate(fd, RING_SIZE / 2);
	e = errno;
	expect_err(id, "ftruncate(fd, 512 KiB)", r, e, EPERM);
	r = ftruncate(fd, 2 * RING_SIZE);
	e = errno;
	expect_err(id, "ftruncate(fd, 2 MiB)", r, e, EPERM);
	r = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096);
	e = errno;
	expect_err(id, "fallocate(fd, PUNCH_HOLE|KEEP_SIZE, 0, 4096)", r, e, EPERM);
	r = fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE);
	e = errno;
	expect_err(id, "(extra) F_ADD_SEALS F_SEAL_WRITE (F_SEAL_SEAL set)", r, e, EPERM);

	/* g: madvise(MADV_REMOVE) on RO mapping */
	snprintf(id, sizeof id, "%sg", pfx);
	p = mmap(NULL, RING_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	if (p != MAP_FAILED) {
		r = madvise(p, 4096, MADV_REMOVE);
		e = errno;
		expect_err(id, "madvise(RO MAP_SHARED mapping, MADV_REMOVE)", r, e, EACCES);
		char b0 = ((volatile char *)p)[4096];
		r = madvise(p, 8192, MADV_DONTNEED);
		e = errno;
		char b1 = ((volatile char *)p)[4096];
		line("INFO", id,
		     "(extra) madvise(RO MAP_SHARED mapping, MADV_DONTNEED) -> %s; byte at 4096 before=0x%02x "
		     "after=0x%02x (unchanged = data kept, only own PTEs dropped)",
		     res(r, e), (unsigned char)b0, (unsigned char)b1);
		munmap(p, RING_SIZE);
	}

	if (!include_cow)
		return;
	/* h: MAP_PRIVATE RW works, COW */
	snprintf(id, sizeof id, "%sh", pfx);
	char *pp = mmap_chk(id, "mmap(PROT_READ|PROT_WRITE, MAP_PRIVATE)", 1, 0, RING_SIZE,
			    PROT_READ | PROT_WRITE, MAP_PRIVATE, fd);
	if (pp != MAP_FAILED) {
		char before = ro_view[COW_OFF];
		pp[COW_OFF] = 0x77;
		char after = ro_view[COW_OFF];
		line(pp[COW_OFF] == 0x77 && after == before ? "PASS" : "FAIL", id,
		     "write via MAP_PRIVATE: private view=0x%02x, shared RO view before=0x%02x after=0x%02x "
		     "[expect shared view unchanged]",
		     (unsigned char)pp[COW_OFF], (unsigned char)before, (unsigned char)after);
		munmap(pp, RING_SIZE);
	}
}

static void fact3(void)
{
	char sb[128];
	int fd = memfd_create("ei-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		line("FAIL", "3.0", "memfd_create -> %s", res(-1, errno));
		return;
	}
	if (ftruncate(fd, RING_SIZE) != 0) {
		line("FAIL", "3.0", "ftruncate -> %s", res(-1, errno));
		return;
	}
	char *rw = mmap(NULL, RING_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (rw == MAP_FAILED) {
		line("FAIL", "3.0", "mmap RW -> %s", res(-1, errno));
		return;
	}
	memset(rw, 0, RING_SIZE);
	rw[COW_OFF] = 0x11;
	struct ringhdr *H = (struct ringhdr *)rw;

	int r = fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
	int e = errno;
	expect_ok("3.0", "F_ADD_SEALS SHRINK|GROW|FUTURE_WRITE|SEAL while RW MAP_SHARED mapping exists", r, e);
	int s = fcntl(fd, F_GET_SEALS);
	seals_str(s, sb, sizeof sb);
	line("INFO", "3.0", "F_GET_SEALS -> %s", sb);

	rw[4096] = 0x42;
	H->w_wait = 0;
	line(rw[4096] == 0x42 ? "PASS" : "FAIL", "3.1",
	     "pre-existing RW MAP_SHARED mapping still writable after FUTURE_WRITE [expect yes]");
	{
		long w = pwrite(fd, "x", 1, 0);
		e = errno;
		expect_err("3.2", "(extra) owner (uid 0, same O_RDWR fd) pwrite after FUTURE_WRITE", w, e, EPERM);
		void *p = mmap(NULL, RING_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		e = errno;
		line(p == MAP_FAILED && e == EPERM ? "PASS" : "FAIL", "3.3",
		     "(extra) owner new mmap(RW, MAP_SHARED) after FUTURE_WRITE -> %s [expect -1/EPERM]",
		     p == MAP_FAILED ? res(-1, e) : "mapped (UNEXPECTED)");
		if (p != MAP_FAILED)
			munmap(p, RING_SIZE);
	}

	/* fd must survive exec-less fork: MFD_CLOEXEC only matters on exec */
	int p2c[2], c2p[2];
	if (pipe(p2c) || pipe(c2p)) {
		line("FAIL", "3.0", "pipe -> %s", res(-1, errno));
		return;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		close(p2c[1]);
		close(c2p[0]);
		if (drop_to_nobody() != 0) {
			line("FAIL", "3.c0", "drop to uid %d -> %s", NOBODY, res(-1, errno));
			_exit(1);
		}
		line("INFO", "3.c0", "child pid %d now uid=%u euid=%u gid=%u, using inherited O_RDWR memfd fd %d",
		     getpid(), getuid(), geteuid(), getgid(), fd);

		/* a: RO shared mapping */
		char *ro = mmap_chk("3.a", "child mmap(PROT_READ, MAP_SHARED)", 1, 0, RING_SIZE, PROT_READ,
				    MAP_SHARED, fd);
		if (ro == MAP_FAILED)
			_exit(2);
		line(ro[4096] == 0x42 ? "PASS" : "FAIL", "3.a",
		     "child RO mapping sees parent's write (byte=0x%02x) [expect 0x42]", (unsigned char)ro[4096]);

		child_mutation_tests("3.", fd, 1, ro);

		/* f: reopen via /proc/self/fd/N */
		if (have_proc()) {
			char path[64];
			snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
			int fd2 = open(path, O_RDWR | O_CLOEXEC);
			e = errno;
			line(fd2 >= 0 ? "INFO" : "INFO", "3.f",
			     "child (uid %d) open(\"%s\", O_RDWR) on 0777 memfd -> %s", NOBODY, path,
			     res(fd2, e));
			if (fd2 >= 0) {
				s = fcntl(fd2, F_GET_SEALS);
				seals_str(s, sb, sizeof sb);
				line("INFO", "3.f", "new fd %d F_GET_SEALS -> %s (same inode, seals are per-inode)", fd2,
				     sb);
				child_mutation_tests("3.f.", fd2, 0, ro);
				close(fd2);
			}
		} else
			line("SKIP", "3.f", "/proc not available");

		/* i: FUTEX_WAIT (shared) on RO mapping, woken by parent */
		{
			struct ringhdr *h = (struct ringhdr *)ro;
			/* first prove it really sleeps: nobody wakes w_to, 200 ms timeout */
			struct timespec to = {0, 200 * 1000 * 1000};
			uint64_t t0 = now_ns();
			long fr = futex(&h->w_to, FUTEX_WAIT, 0, &to);
			e = errno;
			uint64_t t1 = now_ns();
			line(fr == -1 && e == ETIMEDOUT ? "PASS" : "FAIL", "3.i0",
			     "child FUTEX_WAIT(shared) on RO mapping, nobody wakes, 200 ms timeout -> %s after %.1f ms "
			     "[expect ETIMEDOUT ~200 ms]",
			     res(fr, e), (t1 - t0) / 1e6);

			to.tv_sec = 2;
			to.tv_nsec = 0;
			xwrite1(c2p[1], 'W');
			t0 = now_ns();
			fr = futex(&h->w_wait, FUTEX_WAIT, 0, &to);
			e = errno;
			t1 = now_ns();
			uint64_t tw = h->t_wake;
			const char *how = (fr == 0) ? "WAKE" : (e == ETIMEDOUT ? "TIMEOUT" : (e == EAGAIN ? "EAGAIN(value changed before sleep)" : "OTHER"));
			line(fr == 0 ? "PASS" : "FAIL", "3.i",
			     "child FUTEX_WAIT(shared, val 0, 2 s) on RO mapping -> %s: woke by %s, slept %.3f ms, "
			     "wake latency (parent pre-FUTEX_WAKE -> child running) %.1f us, word now %u [expect WAKE]",
			     res(fr, e), how, (t1 - t0) / 1e6, tw ? (double)(int64_t)(t1 - tw) / 1e3 : -1.0, h->w_wait);
		}

		/* j: futex_waitv on two words in RO mapping */
		{
			struct ringhdr *h = (struct ringhdr *)ro;
			struct futex_waitv_ wv[2];
			memset(wv, 0, sizeof wv);
			wv[0].val = 0;
			wv[0].uaddr = (uintptr_t)&h->w_v1;
			wv[0].flags = FUTEX2_SIZE_U32_; /* shared: no FUTEX2_PRIVATE */
			wv[1].val = 0;
			wv[1].uaddr = (uintptr_t)&h->w_v2;
			wv[1].flags = FUTEX2_SIZE_U32_;
			struct timespec abs;
			clock_gettime(CLOCK_MONOTONIC, &abs);
			abs.tv_sec += 2;
			xwrite1(c2p[1], 'V');
			uint64_t t0 = now_ns();
			long fr = syscall(SYS_futex_waitv_nr, wv, 2, 0, &abs, CLOCK_MONOTONIC);
			e = errno;
			uint64_t t1 = now_ns();
			uint64_t tw = h->t_wake;
			if (fr == -1 && e == ENOSYS) {
				line("INFO", "3.j", "futex_waitv (syscall 449) -> ENOSYS (not supported by this kernel)");
			} else {
				const char *how = (fr >= 0) ? "WAKE" : (e == ETIMEDOUT ? "TIMEOUT" : (e == EAGAIN ? "EAGAIN" : "OTHER"));
				line(fr == 1 ? "PASS" : "FAIL", "3.j",
				     "child futex_waitv(2 shared U32 words in RO mapping, abs CLOCK_MONOTONIC +2 s) -> %s "
				     "(index of woken word): woke by %s, slept %.3f ms, wake latency %.1f us [expect ret=1, WAKE]",
				     res(fr, e), how, (t1 - t0) / 1e6, tw ? (double)(int64_t)(t1 - tw) / 1e3 : -1.0);
			}
		}

		/* k: FUTEX_WAKE by the child via the RO mapping, parent is waiting */
		{
			struct ringhdr *h = (struct ringhdr *)ro;
			xread1(p2c[0]); /* parent says it's about to wait */
			usleep(100 * 1000);
			long fr = futex(&h->w_k, FUTEX_WAKE, INT_MAX, NULL);
			e = errno;
			line(fr == 1 ? "PASS" : "FAIL", "3.k",
			     "child FUTEX_WAKE(shared) via RO mapping while parent waits -> %s (waiters woken) "
			     "[expect allowed, ret=1]",
			     res(fr, e));
			fr = futex(&h->w_k, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
			e = errno;
			line("INFO", "3.k", "(extra) child FUTEX_WAKE_PRIVATE on the RO shared mapping, no waiter -> %s",
			     res(fr, e));
		}
		_exit(0);
	}

	/* parent */
	close(p2c[0]);
	close(c2p[1]);

	/* i */
	if (xread1(c2p[0]) == 'W') {
		usleep(150 * 1000);
		H->t_wake = now_ns();
		__atomic_add_fetch(&H->w_wait, 1, __ATOMIC_SEQ_CST);
		long n = futex(&H->w_wait, FUTEX_WAKE, INT_MAX, NULL);
		e = errno;
		line(n == 1 ? "PASS" : "FAIL", "3.i",
		     "parent FUTEX_WAKE(shared) via RW mapping after increment -> %s waiters woken [expect 1]", res(n, e));
	}
	/* j */
	if (xread1(c2p[0]) == 'V') {
		usleep(150 * 1000);
		H->t_wake = now_ns();
		__atomic_add_fetch(&H->w_v2, 1, __ATOMIC_SEQ_CST);
		long n = futex(&H->w_v2, FUTEX_WAKE, INT_MAX, NULL);
		e = errno;
		line("INFO", "3.j", "parent FUTEX_WAKE(shared) on word 1 -> %s waiters woken (expect 1 if futex_waitv "
				    "supported)",
		     res(n, e));
	}
	/* k */
	{
		struct timespec to = {2, 0};
		xwrite1(p2c[1], 'K');
		uint64_t t0 = now_ns();
		long fr = futex(&H->w_k, FUTEX_WAIT, 0, &to);
		e = errno;
		uint64_t t1 = now_ns();
		line(fr == 0 ? "PASS" : "FAIL", "3.k",
		     "parent FUTEX_WAIT(shared) on its RW mapping, woken by child -> %s after %.1f ms [expect WAKE]",
		     res(fr, e), (t1 - t0) / 1e6);
	}
	int st;
	waitpid(pid, &st, 0);
	line(WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "INFO" : "FAIL", "3.c0", "child 1 exit status 0x%x", st);
	line(rw[COW_OFF] == 0x11 ? "PASS" : "FAIL", "3.h",
	     "parent's view of byte written by child via MAP_PRIVATE = 0x%02x [expect 0x11 unchanged]",
	     (unsigned char)rw[COW_OFF]);
	close(p2c[1]);
	close(c2p[0]);

	/* f (second part): fchmod 0400 by owner uid 0, then reopen as uid 65534 */
	r = fchmod(fd, 0400);
	e = errno;
	expect_ok("3.f2", "parent fchmod(memfd, 0400) (sealed memfd; seals do not cover mode)", r, e);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		if (drop_to_nobody() != 0) {
			line("FAIL", "3.f2", "drop uid -> %s", res(-1, errno));
			_exit(1);
		}
		if (have_proc()) {
			char path[64];
			snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
			int fd2 = open(path, O_RDWR | O_CLOEXEC);
			e = errno;
			expect_err("3.f2", "child (uid 65534) open(/proc/self/fd/N, O_RDWR) after fchmod 0400", fd2, e,
				   EACCES);
			if (fd2 >= 0)
				close(fd2);
			fd2 = open(path, O_RDONLY | O_CLOEXEC);
			e = errno;
			expect_err("3.f2", "child (uid 65534) open(/proc/self/fd/N, O_RDONLY) after fchmod 0400", fd2, e,
				   EACCES);
			if (fd2 >= 0)
				close(fd2);
		} else
			line("SKIP", "3.f2", "/proc not available");
		void *p = mmap_chk("3.f2", "child: inherited fd still mmap(PROT_READ, MAP_SHARED) after fchmod 0400", 1, 0,
				   RING_SIZE, PROT_READ, MAP_SHARED, fd);
		if (p != MAP_FAILED)
			munmap(p, RING_SIZE);
		_exit(0);
	}
	waitpid(pid, &st, 0);
	munmap(rw, RING_SIZE);
	close(fd);
}

/* ------------------------------------------------------------------ fact 4 */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void bench(const char *id, const char *what, volatile uint32_t *w, int op, int use_getppid)
{
	enum { TOTAL = 1000000, BATCH = 10000, NB = TOTAL / BATCH };
	double per[NB];
	uint64_t t_all0 = now_ns();
	for (int b = 0; b < NB; b++) {
		uint64_t t0 = now_ns();
		for (int i = 0; i < BATCH; i++) {
			if (use_getppid)
				syscall(SYS_getppid);
			else
				futex(w, op, INT_MAX, NULL);
		}
		per[b] = (double)(now_ns() - t0) / BATCH;
	}
	uint64_t t_all = now_ns() - t_all0;
	qsort(per, NB, sizeof per[0], cmp_double);
	line("INFO", id, "%s: %d calls, ns/call p50=%.1f min=%.1f p90=%.1f max=%.1f (batches of %d), total %.3f s",
	     what, TOTAL, per[NB / 2], per[0], per[NB * 9 / 10], per[NB - 1], BATCH, t_all / 1e9);
}

static void fact4(void)
{
	int fd = memfd_create("ei-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, RING_SIZE) != 0) {
		line("FAIL", "4", "memfd -> %s", res(-1, errno));
		return;
	}
	volatile uint32_t *w = mmap(NULL, RING_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (w == MAP_FAILED) {
		line("FAIL", "4", "mmap -> %s", res(-1, errno));
		return;
	}
	fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
	*w = 1;
	long r = futex(w, FUTEX_WAKE, INT_MAX, NULL);
	if (r < 0) {
		line("FAIL", "4", "FUTEX_WAKE -> %s", res(r, errno));
		return;
	}
	bench("4.a", "FUTEX_WAKE (shared) on sealed-memfd MAP_SHARED word, no waiters", w, FUTEX_WAKE, 0);
	bench("4.b", "(comparison) FUTEX_WAKE_PRIVATE on same word, no waiters", w, FUTEX_WAKE_PRIVATE, 0);
	bench("4.c", "(baseline) syscall(getppid)", w, 0, 1);
	munmap((void *)w, RING_SIZE);
	close(fd);
}

/* ------------------------------------------------------------------ main */

static void pid1_setup(void)
{
	mkdir("/dev", 0755);
	if (mount("devtmpfs", "/dev", "devtmpfs", 0, NULL) != 0 && errno != EBUSY) {
		/* nothing we can print to yet */
	}
	int cfd = open("/dev/console", O_RDWR | O_NOCTTY);
	if (cfd < 0)
		cfd = open("/dev/ttyS0", O_RDWR | O_NOCTTY);
	if (cfd >= 0) {
		dup2(cfd, 0);
		dup2(cfd, 1);
		dup2(cfd, 2);
		if (cfd > 2)
			close(cfd);
	}
	mkdir("/proc", 0555);
	if (mount("proc", "/proc", "proc", 0, NULL) != 0)
		fprintf(stderr, "mount /proc: %s\n", strerror(errno));
	mkdir("/tmp", 01777);
	mkdir("/tmp/t", 0755);
	if (mount("tmpfs", "/tmp/t", "tmpfs", 0, "size=16m") != 0)
		fprintf(stderr, "mount tmpfs /tmp/t: %s\n", strerror(errno));
}

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	g_pid1 = (getpid() == 1);
	if (g_pid1)
		pid1_setup();
	setvbuf(stdout, NULL, _IOLBF, 0);

	struct utsname u;
	uname(&u);
	printf("=== SEALCHECK BEGIN ===\n");
	line("INFO", "0", "uname: %s %s %s %s (%s), pid=%d uid=%d", u.sysname, u.nodename, u.release, u.version,
	     u.machine, getpid(), getuid());
	if (getuid() != 0)
		line("FAIL", "0", "must run as root (needs setuid to %d)", NOBODY);

	fact1();
	fact2(g_pid1 ? "/tmp/t" : "/dev/shm");
	fact3();
	fact4();

	printf("=== SEALCHECK END ===\n");
	fflush(stdout);
	if (g_pid1) {
		sync();
		reboot(RB_POWER_OFF);
		/* if power-off failed, fall through: exiting PID 1 panics; panic=-1 + -no-reboot ends qemu */
		fprintf(stderr, "reboot(RB_POWER_OFF): %s\n", strerror(errno));
	}
	return 0;
}
