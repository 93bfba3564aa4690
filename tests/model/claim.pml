/*
 * The frame-ring claim protocol of native/include/edgeinfer/ring.h, for spin.
 *
 * One producer publishes MAXSEQ frames into N = 3 slots; one consumer keeps
 * acquiring the newest. Every statement below is one atomic step of the C code
 * (a seq_cst load or store, or a plain access of the producer's own data), and
 * spin explores every interleaving, which is what seq_cst guarantees in C11.
 * The payload is two bytes written in two steps, so a torn read is visible.
 *
 * ABI 2 adds `published`, stored before `latest`, so that a consumer can tell a
 * `latest` that ran ahead of what was published (a lie) from a race: the model
 * asserts that the check never fires for this honest producer, and that a
 * slot that no longer holds the seq `latest` named only happens after `latest`
 * moved on (the consumer's other "corrupt" verdict never fires either).
 *
 * Checked (tests/integration/test_protocol_model.py):
 *   safety:   no torn read; frames arrive in increasing order; the producer
 *             always finds a free slot and backs off at most twice per frame
 *             (the consumer only ever claims what `latest` named: the newest);
 *             seq <= published whenever the consumer looks; a mismatching slot
 *             means `latest` has moved
 *   liveness: ltl `newest`: the consumer ends up holding the last frame
 *             (weak fairness: the consumer is not starved by the scheduler)
 */
#define N 3
#define NONE 255
#define MAXSEQ 5
#define EMPTY 0
#define WRITING 1
#define READY 2

/* The `latest` word: seq << 8 | slot, stored and loaded as one unit. */
byte latest_seq = 0;
byte latest_slot = NONE;
byte claimed = NONE;       /* consumer's claimed slot */
byte state[N];             /* slot word, low byte */
byte sseq[N];              /* slot word, seq part */
byte data_a[N];            /* payload, first half */
byte data_b[N];            /* payload, second half */
byte published = 0;        /* seq of the newest frame published, stored before latest */
byte delivered = 0;        /* newest seq the consumer acquired */

proctype producer() {
    byte seq = 1;
    byte s, c, old_state, backoffs;
    do
    :: seq > MAXSEQ -> break
    :: else ->
        backoffs = 0;
pick:
        c = claimed;                                   /* load claimed */
        /* never blocks: some slot is neither claimed nor latest */
        assert((0 != c && 0 != latest_slot) || (1 != c && 1 != latest_slot) || (2 != c && 2 != latest_slot));
        if                                             /* any free slot: spin tries each */
        :: (0 != c && 0 != latest_slot) -> s = 0
        :: (1 != c && 1 != latest_slot) -> s = 1
        :: (2 != c && 2 != latest_slot) -> s = 2
        fi;
        old_state = state[s];
        state[s] = WRITING;                            /* store word = old seq | WRITING */
        if
        :: claimed == s ->                             /* Dekker re-check lost: give it back */
            state[s] = old_state;
            backoffs++;
            assert(backoffs <= 2);
            goto pick
        :: else -> skip
        fi;
        data_a[s] = seq;                               /* fill the payload (two steps) */
        data_b[s] = seq;
        atomic { sseq[s] = seq; state[s] = READY }     /* store word = seq | READY */
        published = seq;                               /* store published */
        atomic { latest_seq = seq; latest_slot = s }   /* store latest */
        seq++
    od
}

proctype consumer() {
    byte q, s, a, b, p, q2;
    byte last = 0;
    do
    :: last == MAXSEQ -> break
    :: else ->
        atomic { q = latest_seq; s = latest_slot };    /* load latest */
        if
        :: q <= last -> skip                           /* nothing new yet */
        :: else ->
            p = published;                             /* load published */
            assert(q <= p);                            /* the "ran ahead" check never fires */
            claimed = s;                               /* store claimed */
            if
            :: (state[s] == READY && sseq[s] == q) ->  /* load word: still seq q? */
                a = data_a[s];                         /* read the payload while holding it */
                b = data_b[s];
                assert(a == q && b == q);              /* never torn */
                assert(q > last);                      /* in order */
                last = q;
                delivered = q;
                claimed = NONE                         /* release */
            :: else ->                                 /* the slot moved on: so did latest */
                claimed = NONE;
                q2 = latest_seq;                       /* load latest again */
                assert(q2 != q)                        /* "latest names a frame not there" never fires */
            fi
        fi
    od
}

init {
    atomic { run producer(); run consumer() }
}

ltl newest { <> (delivered == MAXSEQ) }
