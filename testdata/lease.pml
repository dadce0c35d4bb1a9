/*
 * lease.pml: the lease protocol of monolock, for spin.
 *
 * One lock, two client sessions and the server. Time is a global count of
 * ticks; both sides read it, so the model assumes clocks that run at the
 * same rate (bounded drift can be folded into a smaller TIMEOUT). Messages
 * travel on per-direction channels where the network may hold them for any
 * number of ticks and, unless NOLOSS is defined, lose any of them. A
 * partition is the loss of everything from some moment on; a client's
 * close (FIN) may be lost like any other message.
 *
 * The server drops a session whose silence exceeds LEASE ticks and then
 * promotes the waiter with a push. A client counts its claim from the send
 * time of its last confirmed request and abandons it TIMEOUT ticks later;
 * it sends a heartbeat INTERVAL ticks after its last send, one at a time;
 * the promotion push confirms nothing. The clock cannot pass a deadline
 * that is due: timeouts and expiries happen at the tick they fall due.
 *
 * Properties (select with pan -N):
 *   safety  a client believes it holds the lock only while the server has
 *           it as the holder: never two believers, never a believer the
 *           server has replaced; tokens rise (asserts)
 *   live    with NOLOSS and DELIVER1 (the waiter's messages arrive within
 *           the tick), the second client is eventually granted
 *
 * Switches that make the client wrong, each refuted by a trail:
 *   MUTANT_ARRIVAL  the timeout counts from the reply's arrival
 *   MUTANT_PUSH     the promotion push counts as the reply of the heartbeat
 *                   in flight
 *
 * The model's ratios (TIMEOUT 3, INTERVAL 2 of LEASE 4) are coarser than
 * the client's (0.8 and 0.25), so that both wrong rules fit in a few ticks;
 * the argument for safety needs only TIMEOUT < LEASE.
 */

#ifndef LEASE
#define LEASE 4
#endif
#ifndef TIMEOUT
#define TIMEOUT 3
#endif
#ifndef INTERVAL
#define INTERVAL 2
#endif
#ifndef MAXT
#define MAXT 9
#endif

#define NONE 255

mtype = { ACQ, HB, CLOSE, WAITING, ACQUIRED, EOF };

chan c2s[2] = [4] of { mtype };
chan s2c[2] = [4] of { mtype, byte };	/* ACQUIRED carries the token */

byte now = 0;

/* The clients' view. */
bool holds[2];		/* believes it holds the lock */
bool claiming[2];	/* has a claim (queued or holding) that can time out */
byte deadline[2];	/* confirmed send time + TIMEOUT */
byte lastSend[2];	/* of the request in flight, or of the last one */
bool inflight[2];	/* a request awaits its reply */
byte lastToken = 0;	/* the highest token a client has held */

/* The server's view. */
byte holder = NONE;
bool registered[2];
bool waiting[2];
byte lastSeen[2];
byte token = 0;
byte granted[2];

#define clientDue(i) (claiming[i] && now >= deadline[i])
#define serverDue(i) (registered[i] && now - lastSeen[i] > LEASE)
#define heartbeatDue(i) (claiming[i] && !inflight[i] && now >= lastSend[i] + INTERVAL)
#ifdef DELIVER1
/* The waiter's messages arrive, and its heartbeats leave, on time. */
#define undelivered (len(c2s[1]) > 0 || len(s2c[1]) > 0 || heartbeatDue(1))
#else
#define undelivered false
#endif

ltl safety { [] ((!holds[0] || holder == 0) && (!holds[1] || holder == 1)) }
ltl live { <> holds[1] }

active proctype clock() {
end:	do
	:: atomic { now < MAXT && !clientDue(0) && !clientDue(1) && !serverDue(0) && !serverDue(1) && !undelivered -> now++ }
	od
}

/* The session of client i ends on the server: the lock goes to the waiter. */
inline release(i) {
	registered[i] = false;
	waiting[i] = false;
	if
	:: holder == i ->
		holder = NONE;
		if
		:: registered[1-i] && waiting[1-i] ->
			token++;
			holder = 1-i;
			waiting[1-i] = false;
			granted[1-i] = token;
			s2c[1-i]!ACQUIRED,token	/* the push */
		:: else
		fi
	:: else
	fi
}

inline serve(i, m) {
	if
	:: m == ACQ ->
		registered[i] = true;
		lastSeen[i] = now;
		if
		:: holder == NONE ->
			token++;
			holder = i;
			granted[i] = token;
			s2c[i]!ACQUIRED,token
		:: else ->
			waiting[i] = true;
			s2c[i]!WAITING,0
		fi
	:: m == HB && registered[i] ->
		lastSeen[i] = now;
		if
		:: holder == i -> s2c[i]!ACQUIRED,granted[i]
		:: else -> s2c[i]!WAITING,0
		fi
	:: m == CLOSE && registered[i] -> release(i)
	:: else	/* after the session ended: the connection is gone */
	fi
}

active proctype server() {
	mtype m;
end:	do
	:: atomic { c2s[0]?m -> serve(0, m) }
	:: atomic { c2s[1]?m -> serve(1, m) }
	:: atomic { serverDue(0) -> release(0); s2c[0]!EOF,0 }	/* expiry closes the connection */
	:: atomic { serverDue(1) -> release(1); s2c[1]!EOF,0 }
	od
}

#ifndef NOLOSS
active proctype network() {
end:	do
	:: c2s[0]?_
	:: c2s[1]?_
	:: s2c[0]?_,_
	:: s2c[1]?_,_
	od
}
#endif

#ifdef MUTANT_ARRIVAL
#define confirm() inflight[i] = false; deadline[i] = now + TIMEOUT
#else
#define confirm() inflight[i] = false; deadline[i] = lastSend[i] + TIMEOUT
#endif

inline hold(i, t) {
	holds[i] = true;
	assert(t > lastToken);	/* tokens rise from holder to holder */
	lastToken = t
}

proctype client(byte i) {
	byte t;
	bool queued;
	mtype m;

	atomic {
		c2s[i]!ACQ;
		lastSend[i] = now;
		inflight[i] = true;
		deadline[i] = now + TIMEOUT;	/* the ACQUIRE's answer is due within TIMEOUT */
		claiming[i] = true
	}
end:	do
	:: atomic { s2c[i]?m,t ->
		if
		:: m == EOF -> goto giveup
		:: m == ACQUIRED && queued ->
			/* the promotion push: it confirms nothing */
			queued = false;
			hold(i, t);
#ifdef MUTANT_PUSH
			if
			:: inflight[i] -> confirm()
			:: else
			fi
#endif
		:: else ->
			if
			:: !inflight[i] -> goto giveup	/* unsolicited: a protocol violation */
			:: inflight[i] && m == WAITING && holds[i] -> goto giveup
			:: inflight[i] && m == WAITING && !holds[i] ->
				confirm();
				queued = true
			:: inflight[i] && m == ACQUIRED ->
				confirm();
				if
				:: !holds[i] -> hold(i, t)
				:: else
				fi
			fi
		fi }
	:: atomic { heartbeatDue(i) ->
		c2s[i]!HB;
		lastSend[i] = now;
		inflight[i] = true }
	:: atomic { holds[i] -> goto giveup }	/* done with the lock: close */
	:: atomic { clientDue(i) -> goto giveup }	/* no confirmation in time */
	od;
giveup:
	atomic {
		holds[i] = false;	/* before the close lets the server grant again */
		claiming[i] = false;
		c2s[i]!CLOSE
	}
end_drain:
	do
	:: s2c[i]?_,_
	od
}

init {
	atomic {
		run client(0);
		run client(1)
	}
}
