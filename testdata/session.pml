/*
 * session.pml: the session writer / cut / stop protocol of server.go, for
 * spin. docs/sessions.md is the design; each step below names the function
 * of server.go it stands for.
 *
 * NS sessions (2: S0 holds the one lock, S1 waits for it), each with its
 * reader goroutine (run), writers started by wakeLocked, an administrator
 * (ForceRelease / KickWaiter, once) and a Shutdown (then maybe Close).
 *
 * srv.mu is a variable; a critical section is one atomic step that takes
 * it (the Lock and everything up to the next lock-free action), and the
 * Unlock is a step of its own, which also sets the past write deadlines of
 * the cuts decided in it: between a critical section's stopped.Store and
 * its cut only lock-free actions of others can come, and they are exactly
 * the interleavings between the two steps. Everything done without srv.mu
 * (the writer's SetWriteDeadline, its loads of stopped, each unit of a
 * write, closeConn) is a step of its own.
 *
 * Frames are counted in units: WAITING is 1, ACQUIRED and ERROR are 2, so
 * that a write can stop inside a frame. MAXB is maxBatch in units.
 *
 * A Write is that of Go's internal/poll.FD (TCP) or net.Pipe: the
 * deadline is checked when the write begins, then units go out while the
 * socket has room, whatever the deadline; only when it must wait for room
 * does a passed deadline (or the io-timeout, or a reset) end it. With
 * -DIDEAL the deadline is checked before every unit, as if a deadline
 * stopped a write at its next byte (what a reader of the cut may assume).
 *
 * Properties, all assertions; -DPROPS=mask selects them (default all):
 *   1 (P1) nothing is decided for a session that has ended; nothing decided
 *      is written twice; after an end that is not the session's own bad
 *      frame (the end's critical section over), no frame begins but the
 *      final ERROR (the rest of a frame already begun may follow)
 *   2 (P2) once ForceRelease / KickWaiter has returned, no frame begins on
 *      that session but its ERROR 0x02; no write is made holding srv.mu
 *      (the administrator waits only for srv.mu, never for a socket)
 *   4 (P3) frames reach the client whole and in the order decided
 *      (WAITINGs, ACQUIREDs, one ERROR, nothing after it); never two
 *      writers of one session at once
 *   8 (P4) at the end (no step left): nobody holds srv.mu or a writer's
 *      role, every ended session is closed, no live session is owed
 *      anything (no lost wake-up); and pan's end states: no deadlock
 *  16 (P5) a grant is decided only for a waiting session (never an ending
 *      one)
 *  32 (P6) a session ended with a code (0x01, 0x02, its bad frame) gets
 *      that ERROR whole, unless a write of its own really failed (a reset,
 *      the io-timeout) or Close cut it short
 *  64 (P2w) P2 for the writes that begin, which is what a Go server can
 *      promise: once ForceRelease / KickWaiter has returned, no Write
 *      begins on that session (passes its deadline check) but the one of
 *      its ERROR 0x02 or the one that finishes a frame the cut left
 *      unfinished; a write that had begun may write on
 * 128 (P1w) P1 likewise: after an end that is not the session's own bad
 *      frame, no Write begins but the final ERROR's or, with a final
 *      ERROR to follow, a frame's finish
 *
 * Switches that make the server wrong, each refuted by a trail:
 *   MUT_CUT_AFTER_UNLOCK  the cut is set after the critical section (as
 *                         before the seventh review)
 *   MUT_NO_RECHECK        the writer gives its role back after a write
 *                         without looking at the outbox again
 *   MUT_NO_DROP           stopLocked does not drop what was owed
 *   MUT_CHECK_FIRST       drainLocked loads stopped before setting its
 *                         deadline (the order its argument needs, reversed)
 *   MUT_CUT_IS_FAILURE    a cut inside a frame is taken for a failed write
 *                         (before the eighth review)
 *   MUT_TWO_WRITERS       drainOwnLocked does not look at writing
 *   MUT_KEEP_IN_QUEUE     endLocked leaves an ending waiter in the queue
 *   MUT_WRITE_UNDER_MU    drainLocked writes holding srv.mu
 *   MUT_FINISH_ALONE      a cut frame is finished with no final ERROR to
 *                         follow (before the twelfth review)
 */

#ifndef NS
#define NS 2
#endif
#ifndef HB0
#define HB0 1		/* HEARTBEATs the holder's client sends */
#endif
#ifndef HB1
#define HB1 1		/* HEARTBEATs each waiter's client sends */
#endif
#ifndef MAXB
#define MAXB 3		/* maxBatch, in units */
#endif
#ifndef FAILS
#define FAILS 1		/* real write failures (reset, io-timeout) in a run */
#endif
#ifndef PROPS
#define PROPS 255
#endif

#define prop(k, c) assert(!(PROPS & (k)) || (c))

#define NONE 255
#define FREE 255

/* phase */
#define WAITING 1
#define HOLDING 2
#define ENDING 3
#define CLOSED 4

/* the final ERROR's code: none, 0x01 Shutdown, 0x02 administrator, the
 * session's own bad frame */
#define NOCODE 0
#define SHUT 1
#define ADMIN 2
#define BAD 3

/* unit kinds, in the order they are decided */
#define KW 1
#define KA 2
#define KE 3

/* Write's outcome */
#define OK 0
#define TIMEOUT 1
#define OTHER 2

byte mu = FREE;

/* The lock table: one lock. */
byte holder = NONE;
byte q[NS];		/* the waiters, FIFO */
byte qlen = 0;
bool closing = false;

/* A session's state under srv.mu. */
byte phase[NS];
byte owedW[NS], owedA[NS];
byte fin[NS];		/* s.final: the owed final ERROR's code */
bool writing[NS];
bool stopped[NS];	/* atomic: loaded without srv.mu */

/* Its socket: the write deadline (past or not) and the close. */
bool dlPast[NS];
bool connClosed[NS];
byte failsLeft = FAILS;

/* Observers: what was decided, what the client received. */
byte decW[NS], decA[NS];	/* frames decided, ever */
byte endCode[NS];		/* the final ERROR decided at the end */
bool after[NS];			/* ended, not by its own bad frame: its end's critical section is over */
bool adminRet[NS];		/* ForceRelease / KickWaiter of it has returned */
bool realFail[NS];		/* a write of its own really failed, or Close closed it */
byte cmid[NS];			/* units left of the frame the client is inside */
byte clast[NS];			/* kind of the last frame begun */
byte gotW[NS], gotA[NS], gotE[NS], gotCode[NS];
byte inw[NS];			/* writers between their take and their relock */

/* Scratch, used only inside one atomic step: not part of the state. */
hidden byte i, j, nx, kind;
hidden byte first;

/* Each process's own temporaries (inlines are expanded in place); reset
 * when dead, so that stale values do not tell states apart. */
#define LOCALS byte bw, ba, bfin, wn, werr, fe, cuts, marks; \
	bool st0, late, cut, closeIt, granted

/* ---- srv.mu ---- */

#define lockMu	mu == FREE -> mu = _pid

/* srv.mu.Unlock, with the cuts that dropLocked decided in the critical
 * section (a past write deadline: under srv.mu, as dropLocked sets it). */
#ifndef MUT_CUT_AFTER_UNLOCK
inline unlock() {
	atomic {
		i = 0;
		do
		:: i < NS ->
			if :: cuts & (1 << i) -> dlPast[i] = true; printf("MSC: S%d: cut (past write deadline), under srv.mu\n", i) :: else fi;
			if :: marks & (1 << i) -> after[i] = true :: else fi;
			i++
		:: else -> break
		od;
		cuts = 0; marks = 0; granted = false;
		mu = FREE;
		printf("MSC: %d: srv.mu.Unlock\n", _pid)
	}
}
#else
inline unlock() {
	atomic {
		i = 0;
		do
		:: i < NS -> if :: marks & (1 << i) -> after[i] = true :: else fi; i++
		:: else -> break
		od;
		marks = 0; granted = false;
		mu = FREE
	}
	atomic {	/* the cut, after unlocking */
		i = 0;
		do
		:: i < NS -> if :: cuts & (1 << i) -> dlPast[i] = true; printf("MSC: S%d: cut (past write deadline), after unlocking\n", i) :: else fi; i++
		:: else -> break
		od;
		cuts = 0
	}
}
#endif

/* ---- deciding, under srv.mu ---- */

/* owe: n answers, WAITING or ACQUIRED by the phase (rule 2). */
inline owe(x) {
	prop(1, phase[x] < ENDING);
	if
	:: phase[x] == WAITING -> owedW[x]++; decW[x]++
	:: else -> owedA[x]++; decA[x]++
	fi
}

/* grantLocked: x holds the lock and is owed the pushed ACQUIRED. */
inline grantLocked(x) {
	prop(16, phase[x] == WAITING);
	printf("MSC: S%d: granted (push owed)\n", x);
	holder = x;
	phase[x] = HOLDING;
	owe(x);
	granted = true
}

/* dropLocked: drops what x was owed and not yet taken, stores stopped,
 * and, if a writer is at work, cuts (sets a past write deadline: applied
 * by unlock, see there). */
inline dropLocked(x) {
	printf("MSC: S%d: dropLocked (drops W%d A%d)\n", x, owedW[x], owedA[x]);
	owedW[x] = 0; owedA[x] = 0;
	stopped[x] = true;
	if :: writing[x] -> cuts = cuts | (1 << x) :: else fi
}

/* wakeLocked: a writer for x unless one is at work (rule 8). */
inline wakeLocked(x) {
	if
	:: !writing[x] -> writing[x] = true; run writer(x); printf("MSC: S%d: wakeLocked starts a writer\n", x)
	:: else
	fi
}

inline dequeue(x) {
	i = 0;
	do
	:: i < qlen && q[i] != x -> i++
	:: else -> break
	od;
	if
	:: i < qlen ->
		do
		:: i + 1 < qlen -> q[i] = q[i + 1]; i++
		:: else -> break
		od;
		qlen--
	:: else
	fi
}

/* endLocked for a waiter whose lease has passed, as promoteLocked's
 * stopLocked(next, errExpired) makes it: drop, ending, out of the queue.
 * (Promela inlines do not recurse: this is endLocked's waiter branch.) */
inline endExpiredWaiterLocked(x) {
	printf("MSC: S%d: promoteLocked finds its lease passed\n", x);
	dropLocked(x);
	phase[x] = ENDING; fin[x] = NOCODE;
	dropLocked(x);
	marks = marks | (1 << x);
	dequeue(x)
}

/* promoteLocked: the head of the queue is granted, unless its lease has
 * passed (the server's clock: either may be true), then it is ended
 * expired and the next tried; wakeLocked for each (rule 7). */
inline promoteLocked() {
	do
	:: qlen > 0 && holder == NONE ->
		nx = q[0];
		if
		:: true -> endExpiredWaiterLocked(nx)	/* time.Since(seen) >= lease */
		:: true -> dequeue(nx); grantLocked(nx)
		fi;
		wakeLocked(nx)
	:: else -> break
	od
}

/* endLocked: out of the table, once (rule 4); the final ERROR if the
 * cause has a code, else a drop; a holder's lock is promoted unless
 * closing. */
inline endLocked(x, code) {
	if
	:: phase[x] >= ENDING
	:: else ->
		printf("MSC: S%d: endLocked, code %d\n", x, code);
		phase[x] = ENDING; fin[x] = NOCODE;
		if
		:: code != NOCODE -> fin[x] = code; endCode[x] = code
		:: else -> dropLocked(x)
		fi;
		if :: code != BAD -> marks = marks | (1 << x) :: else fi;
		if
		:: holder == x ->
			holder = NONE;
			if :: !closing -> promoteLocked() :: else fi
		:: else ->
#ifndef MUT_KEEP_IN_QUEUE
			dequeue(x)
#else
			skip
#endif
		fi
	fi
}

/* stopLocked: another party's end (Shutdown, an administrator, a failed
 * write): drop first, then endLocked. */
inline stopLocked(x, code) {
	if
	:: phase[x] < ENDING ->
#ifndef MUT_NO_DROP
		dropLocked(x);
#endif
		endLocked(x, code)
	:: else
	fi
}

/* ---- writing, in drainLocked ---- */

/* The batch is bw WAITINGs, ba ACQUIREDs, then the ERROR bfin (if not
 * NOCODE): units [0, bw), [bw, bw+2ba), [bw+2ba, bw+2ba+2). */
#define batchLen (bw + 2 * ba + (bfin != NOCODE -> 2 : 0))

/* One unit reaches the client: the observers' checks. */
inline emit(x, p) {
	atomic {
		if
		:: p < bw -> kind = KW; first = true
		:: p >= bw && p < bw + 2 * ba -> kind = KA; first = ((p - bw) % 2 == 0)
		:: else -> kind = KE; first = (p == bw + 2 * ba)
		fi;
		prop(4, first == (cmid[x] == 0));	/* a frame is never broken into */
		if
		:: first ->
			if
			:: kind == KW -> printf("MSC: S%d: client gets a WAITING\n", x)
			:: kind == KA -> printf("MSC: S%d: client gets the first unit of an ACQUIRED\n", x)
			:: kind == KE -> printf("MSC: S%d: client gets the first unit of ERROR %d\n", x, bfin)
			fi;
			prop(4, kind >= clast[x] && clast[x] != KE);
			prop(1, !after[x] || kind == KE);
			prop(2, !adminRet[x] || (kind == KE && bfin == ADMIN));
			clast[x] = kind;
			if
			:: kind == KW -> gotW[x]++; cmid[x] = 0; prop(1, gotW[x] <= decW[x])
			:: kind == KA -> gotA[x]++; cmid[x] = 1; prop(1, gotA[x] <= decA[x])
			:: kind == KE -> cmid[x] = 1
			fi
		:: else ->
			printf("MSC: S%d: client gets the rest of it\n", x);
			cmid[x]--;
			if :: kind == KE && cmid[x] == 0 -> gotE[x]++; gotCode[x] = bfin :: else fi
		fi
	}
}

/* conn.Write(units [wn, to)) as internal/poll.FD.Write does it: the
 * deadline is checked first (prepareWrite); then a unit goes whenever
 * the socket has room, deadline or not; when it has none (EAGAIN,
 * waitWrite) a passed deadline, the io-timeout or a reset ends the
 * write. wn is left at the units written. */
inline write(x, to) {
	prop(2, mu != _pid);	/* no I/O under srv.mu (rule 1) */
	werr = OK;
	atomic {	/* the deadline check, and what began with it */
		if
		:: connClosed[x] -> werr = OTHER
		:: !connClosed[x] && dlPast[x] -> werr = TIMEOUT
		:: else -> printf("MSC: S%d: Write begins: its deadline is not past\n", x);
			/* a batch with an ERROR was taken after the end, which
			 * dropped all else; wn > 0 is the finish of a cut frame */
			prop(64, !adminRet[x] || bfin == ADMIN || wn > 0);
			prop(128, !after[x] || bfin != NOCODE || wn > 0 && fin[x] != NOCODE)
		fi
	};
	do
	:: werr != OK || wn == to -> break
	:: else ->
		if
#ifdef IDEAL
		:: atomic { !connClosed[x] && !dlPast[x] -> emit(x, wn) }; wn++
		:: atomic { !connClosed[x] && dlPast[x] -> werr = TIMEOUT }
#else
		:: atomic { !connClosed[x] -> emit(x, wn) }; wn++	/* room: the syscall */
		:: atomic { dlPast[x] -> werr = TIMEOUT }	/* no room: waitWrite */
#endif
		:: atomic { connClosed[x] -> werr = OTHER }
		:: atomic { failsLeft > 0 -> failsLeft--; realFail[x] = true; werr = TIMEOUT; printf("MSC: S%d: the io-timeout passes\n", x) }
		:: atomic { failsLeft > 0 -> failsLeft--; realFail[x] = true; werr = OTHER; printf("MSC: S%d: the client resets\n", x) }
		fi
	od
}

/* frameEnd: where the frame holding unit wn-1 ends; 0 for wn 0. */
inline frameEnd() {
	if
	:: wn == 0 -> fe = 0
	:: wn > 0 && wn <= bw -> fe = wn
	:: wn > bw && wn <= bw + 2 * ba -> fe = bw + 2 * ((wn - bw + 1) / 2)
	:: else -> fe = bw + 2 * ba + 2
	fi
}

/* drainLocked(own), entered holding srv.mu and the writer's role. */
inline drainLocked(x, own) {
	do
	:: if	/* expireLocked: another's writer may find x past its lease (rule 10) */
		:: !own && (phase[x] == WAITING || phase[x] == HOLDING) -> printf("MSC: S%d: the writer finds its lease passed\n", x); stopLocked(x, NOCODE)
		:: true
		fi;
		/* takeLocked */
		bw = 0; ba = 0; bfin = NOCODE;
		if
		:: phase[x] == CLOSED
		:: else ->
			do
			:: owedW[x] > 0 && bw < MAXB -> owedW[x]--; bw++
			:: else -> break
			od;
			do
			:: owedW[x] == 0 && owedA[x] > 0 && bw + 2 * ba + 2 <= MAXB -> owedA[x]--; ba++
			:: else -> break
			od;
			if
			:: fin[x] != NOCODE && owedW[x] == 0 && owedA[x] == 0 && bw + 2 * ba + 2 <= MAXB ->
				bfin = fin[x]; fin[x] = NOCODE
			:: else
			fi
		fi;
		if
		:: batchLen == 0 ->	/* nothing owed: the role is given back */
			writing[x] = false;
			closeIt = (phase[x] == ENDING);
			if :: closeIt -> phase[x] = CLOSED :: else fi;
			unlock();
			if :: closeIt -> connClosed[x] = true; printf("MSC: S%d: closeConn\n", x) :: else fi;	/* closeConn */
			closeIt = false;
			break
		:: else
		fi;
		st0 = stopped[x];
		printf("MSC: S%d: %d takes W%d A%d E%d (stopped %d)\n", x, _pid, bw, ba, bfin, st0);
		inw[x]++;
		prop(4, inw[x] == 1);
#ifndef MUT_WRITE_UNDER_MU
		unlock();
#endif
#ifndef MUT_CHECK_FIRST
		dlPast[x] = false;		/* SetWriteDeadline(due) */
		printf("MSC: S%d: SetWriteDeadline(due)\n", x);
		late = stopped[x] && !st0;	/* a drop came since the take */
		printf("MSC: S%d: loads stopped: late %d\n", x, late);
#else
		late = stopped[x] && !st0;
		dlPast[x] = false;
#endif
		wn = 0;
		if :: !late -> write(x, batchLen) :: else -> werr = OK fi;
		cut = (werr == TIMEOUT && stopped[x] && !st0);
		printf("MSC: S%d: Write returns n %d, err %d (0 none, 1 timeout, 2 other), cut %d\n", x, wn, werr, cut);
		frameEnd();
#ifdef MUT_CUT_IS_FAILURE
		cut = cut && wn == 0;
#endif
		atomic {	/* srv.mu.Lock: is an ERROR to follow? */
#ifndef MUT_WRITE_UNDER_MU
			lockMu;
#endif
#ifndef MUT_FINISH_ALONE
			if :: cut && fe > wn && fin[x] != NOCODE :: else -> fe = 0 fi
#else
			if :: cut && fe > wn :: else -> fe = 0 fi
#endif
		};
		if
		:: fe > wn ->	/* cut inside a frame, an ERROR to follow: finish it alone */
#ifndef MUT_WRITE_UNDER_MU
			unlock();
#endif
			dlPast[x] = false;
			write(x, fe);
			cut = (werr == OK);
#ifndef MUT_WRITE_UNDER_MU
			atomic { lockMu }
#endif
		:: else
		fi;
		atomic {
			inw[x]--;
			if
			:: werr == OK
			:: werr != OK && cut -> if :: fin[x] == NOCODE -> fin[x] = bfin :: else fi
			:: werr != OK && !cut ->
				stopLocked(x, NOCODE);
				owedW[x] = 0; owedA[x] = 0; fin[x] = NOCODE
			fi;
			bw = 0; ba = 0; bfin = 0; wn = 0; werr = 0; fe = 0;
			st0 = false; late = false; cut = false;
#ifdef MUT_NO_RECHECK
			writing[x] = false;
			closeIt = (phase[x] == ENDING);
			if :: closeIt -> phase[x] = CLOSED :: else fi;
		}
		unlock();
		if :: closeIt -> connClosed[x] = true :: else fi;
		break
#else
		}
#endif
	od
}

/* A writer goroutine of wakeLocked: Lock, drainLocked(false). */
proctype writer(byte s) {
	LOCALS;
	atomic { lockMu };
	drainLocked(s, false)
}

/* The session's goroutine (acquire, then run): it has joined (joinLocked
 * decided its answer) and holds srv.mu; then drainOwnLocked after each
 * decision of its own, until it ends. */
proctype reader(byte s) {
	LOCALS;
	byte beats = (s == 0 -> HB0 : HB1);
	bool done = false;

	atomic { lockMu };
	do
	:: /* drainOwnLocked() */
#ifndef MUT_TWO_WRITERS
		if
		:: writing[s] -> unlock()
		:: else -> writing[s] = true; drainLocked(s, true)
		fi;
#else
		writing[s] = true; drainLocked(s, true);
#endif
		if
		:: done -> break
		:: else
		fi;
		if
		:: beats > 0 && !connClosed[s] ->
			/* run: a read of one HEARTBEAT; heartbeatLocked */
			beats--;
			atomic {
				lockMu;
				if
				:: phase[s] >= ENDING -> done = true	/* errEnded: endOwnLocked ends nothing */
				:: else -> owe(s); printf("MSC: S%d: heartbeatLocked owes an answer\n", s)
				fi
			}
		:: beats > 0 && !connClosed[s] ->
			/* run: a HEARTBEAT and a bad byte in one read; heartbeatLocked
			 * decides the answer, endOwnLocked the end, in one critical section */
			beats = 0; done = true; granted = false;
			atomic {
				lockMu;
				if
				:: phase[s] >= ENDING
				:: else -> printf("MSC: S%d: heartbeatLocked: a HEARTBEAT and a bad byte\n", s); owe(s); endLocked(s, BAD)
				fi
			}
			/* endOwnLocked: after a promotion, Unlock, Gosched, Lock */
			if :: granted -> granted = false; unlock(); atomic { lockMu } :: else fi
		:: /* run: the read fails: EOF, reset, the lease (read deadline) */
			done = true; granted = false;
			atomic {
				lockMu;
				printf("MSC: S%d: run: the read fails (EOF, lease)\n", s);
				endLocked(s, NOCODE)
			}
			if :: granted -> granted = false; unlock(); atomic { lockMu } :: else fi
		:: /* the client says nothing more (within the model's horizon) */
			break
		fi
	od
}

/* ForceRelease("x", 0) or KickWaiter: kick ends the session it finds,
 * with ERROR 0x02, or as expired (no frame) if its lease has passed by
 * the server's clock (either may be true), wakes its writer, and returns. */
#ifndef NOADMIN
proctype admin() {
	LOCALS;
	byte t = NONE;
	atomic {
		lockMu;
		if
		:: !closing && holder != NONE -> t = holder	/* ForceRelease */
		:: !closing && qlen > 0 -> t = q[0]		/* KickWaiter */
		:: else
		fi;
		if
		:: t != NONE -> printf("MSC: S%d: kick (ForceRelease/KickWaiter) takes srv.mu\n", t); stopLocked(t, ADMIN); wakeLocked(t)
		:: t != NONE -> printf("MSC: S%d: kick finds its lease passed: ends it as expired\n", t); stopLocked(t, NOCODE); wakeLocked(t)
		:: else
		fi
	}
	unlock();
	if :: t != NONE -> adminRet[t] = true; printf("MSC: S%d: ForceRelease/KickWaiter has returned\n", t) :: else fi	/* kick returns */
}
#endif

/* Shutdown: beginCloseLocked stops every session with ERROR 0x01 (or, one
 * whose lease has passed by the server's clock, with none), promoting
 * nobody, then wakeLocked for each; its bound (or ctx) may then Close:
 * beginCloseLocked again, every session closed, every connection closed. */
#ifndef NOSHUTDOWN
proctype shutdown() {
	LOCALS;
	atomic {
		lockMu;
		printf("MSC: Shutdown\n");
		closing = true;
		for (j : 0 .. NS - 1) {	/* beginCloseLocked; expireLocked: a live one past its lease ends with no frame */
			if
			:: phase[j] < CLOSED -> stopLocked(j, SHUT)
			:: phase[j] == WAITING || phase[j] == HOLDING -> printf("MSC: S%d: Shutdown finds its lease passed\n", j); stopLocked(j, NOCODE)
			:: else
			fi
		}
		for (j : 0 .. NS - 1) {
			if :: phase[j] < CLOSED -> wakeLocked(j) :: else fi
		}
	}
	unlock();
#ifdef CLOSE
	atomic {	/* Close, from Shutdown's bound or its ctx */
		lockMu;
		printf("MSC: Close\n");
		for (j : 0 .. NS - 1) {	/* beginCloseLocked, then every session closed */
			if
			:: phase[j] < CLOSED ->
				stopLocked(j, SHUT);
				phase[j] = CLOSED;
				realFail[j] = true
			:: else
			fi
		}
	}
	unlock();
	atomic {	/* closeAll */
		for (j : 0 .. NS - 1) {
			connClosed[j] = true
		}
	}
#endif
}
#endif

/* At the end, when no step is left anywhere. */
proctype atEnd() {
	byte s;
	timeout ->
	atomic {
		prop(8, mu == FREE);
		for (s : 0 .. NS - 1) {
			prop(8, !writing[s]);
			prop(8, phase[s] != ENDING);
			prop(8, phase[s] != CLOSED || connClosed[s]);
			prop(8, phase[s] >= ENDING || (owedW[s] == 0 && owedA[s] == 0 && fin[s] == NOCODE));
			prop(32, endCode[s] == NOCODE || realFail[s] || (gotE[s] == 1 && gotCode[s] == endCode[s]))
		}
	}
}

init {
	atomic {
		/* S0 holds (owed its ACQUIRED), S1 waits (owed its WAITING) */
		holder = 0;
		phase[0] = HOLDING; owedA[0] = 1; decA[0] = 1;
		byte k;
		for (k : 1 .. NS - 1) {
			phase[k] = WAITING; owedW[k] = 1; decW[k] = 1;
			q[qlen] = k; qlen++
		}
		for (k : 0 .. NS - 1) {
			run reader(k)
		}
#ifndef NOADMIN
		run admin();
#endif
#ifndef NOSHUTDOWN
		run shutdown();
#endif
		run atEnd()
	}
}
