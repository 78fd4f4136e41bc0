//! A one-answer reply cell that a blocking caller waits on: a short
//! adaptive spin, then the thread parks until the answer's sender unparks it.
//!
//! The long form: `docs/modules.md`, "`src/sync/reply.rs`".

use super::Arc;
use super::atomic::{AtomicU32, AtomicUsize, Ordering};
use super::cell::UnsafeCell;
use super::thread::{self, Thread};
use std::time::Duration;

const EMPTY: usize = 0;
const WAITING: usize = 1;
const FULL: usize = 2;
const CLOSED: usize = 3;

/// The shared part: the state and the answer's place.
#[derive(Debug)]
struct Cell<T> {
    state: AtomicUsize,
    answer: UnsafeCell<Option<T>>,
}

// SAFETY: the answer is written by the one outstanding sender before its
// release swap and read by the waiter after its acquire load of `FULL`, never
// both at once (the protocol above); the cell hands a `T` between threads.
unsafe impl<T: Send> Sync for Cell<T> {}

/// The waiting side: owns its cell and hands out one sender at a time.
/// Kept across requests, so a caller allocates its cell once.
#[derive(Debug)]
pub(crate) struct ReplyCell<T> {
    cell: Arc<Cell<T>>,
    /// A sender is out and its answer not yet taken: the cell is not ours.
    outstanding: bool,
}

/// The answering side, carried in a request: answers once, or, dropped
/// unanswered, tells the waiter no answer will come.
#[derive(Debug)]
pub(crate) struct ReplyTo<T> {
    cell: Arc<Cell<T>>,
    /// The thread to unpark: the one that took this sender and waits.
    waiter: Thread,
    /// Answered (the drop then does nothing).
    done: bool,
}

/// How long a waiter spins before it parks, learned from its recent waits.
/// An answer caught while spinning raises the budget to twice the attempts
/// it took (never lowers it); a wait that parks takes an eighth off (down
/// to [`SPIN_FLOOR`]); and one parking wait in [`PROBE_EVERY`] spins the
/// most, to find out whether waits got short enough to catch again. On an
/// idle machine the answer comes within the spin and the waiter never
/// sleeps; on a busy one, where the actor needs the waiter's core, spinning
/// only delays the answer, and the budget falls to the floor in a few dozen
/// waits. Measured against halving on a park and doubling on a catch
/// (which never recovers once the typical wait is longer than the floor:
/// a hot-cache client's actor, whose requests come every few microseconds,
/// parked after each one) in `git show d502a2e:docs/performance.md`.
#[derive(Debug)]
pub(crate) struct AdaptiveSpin {
    budget: AtomicU32,
    /// Waits that ended in a park (wrapping; it times the probes).
    failed: AtomicU32,
    most: u32,
}

/// One wait in this many of those that park spins the most it may.
const PROBE_EVERY: u32 = 64;

/// The least a waiter spins once it has spun at all: enough that an answer
/// a few hundred nanoseconds away is still caught, and the budget can grow
/// back when the machine goes quiet.
pub(crate) const SPIN_FLOOR: u32 = 16;

impl AdaptiveSpin {
    /// At most `most` attempts (0: never spin, as under loom); it starts
    /// at the most.
    pub(crate) fn new(most: u32) -> Self {
        Self {
            budget: AtomicU32::new(most),
            failed: AtomicU32::new(0),
            most,
        }
    }

    /// The least budget: [`SPIN_FLOOR`], or the most when that is lower.
    fn floor(&self) -> u32 {
        SPIN_FLOOR.min(self.most)
    }

    /// Spin until `ready` holds or the budget is spent; whether it held.
    /// The budget is a hint shared by whoever waits through this spin
    /// (plain loads and stores: a lost update only changes a hint).
    pub(crate) fn spin(&self, mut ready: impl FnMut() -> bool) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        let failed = self.failed.load(Ordering::Relaxed);
        // Now and then, a wait spins as long as it may: the probe that
        // finds out whether waits got short enough to catch again.
        let limit = if budget < self.most && failed % PROBE_EVERY == PROBE_EVERY - 1 {
            self.most
        } else {
            budget
        };
        for used in 0..limit {
            if ready() {
                let covering = used.saturating_mul(2).saturating_add(self.floor());
                self.budget
                    .store(budget.max(covering).min(self.most), Ordering::Relaxed);
                return true;
            }
            std::hint::spin_loop();
        }
        if ready() {
            return true;
        }
        self.failed.store(failed.wrapping_add(1), Ordering::Relaxed);
        let decayed = budget.saturating_sub(budget / 8).max(self.floor());
        self.budget.store(decayed, Ordering::Relaxed);
        false
    }
}

impl<T> Default for ReplyCell<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ReplyCell<T> {
    pub(crate) fn new() -> Self {
        Self {
            cell: Arc::new(Cell {
                state: AtomicUsize::new(EMPTY),
                answer: UnsafeCell::new(None),
            }),
            outstanding: false,
        }
    }

    /// The sender for the next answer; it will unpark the calling thread,
    /// so the caller waits for it on this thread ([`wait`](Self::wait)). A
    /// cell whose last sender is still out (a wait that gave up) is left to
    /// it, and a fresh one taken.
    pub(crate) fn reply_to(&mut self) -> ReplyTo<T> {
        if self.outstanding {
            *self = Self::new();
        }
        self.outstanding = true;
        ReplyTo {
            cell: self.cell.clone(),
            waiter: thread::current(),
            done: false,
        }
    }

    /// The answer, or `None` when its sender went unanswered. Spins through
    /// `spin`, then parks, waking every `poll` to ask `abandon` whether to
    /// stop waiting (the answer will never come); abandoned, it returns
    /// what arrived by then, if anything.
    pub(crate) fn wait(
        &mut self,
        spin: &AdaptiveSpin,
        poll: Duration,
        mut abandon: impl FnMut() -> bool,
    ) -> Option<T> {
        debug_assert!(self.outstanding, "a wait with no sender out");
        let state = &self.cell.state;
        if !spin.spin(|| state.load(Ordering::Acquire) >= FULL)
            && state
                .compare_exchange(EMPTY, WAITING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            while state.load(Ordering::Acquire) == WAITING {
                thread::park_timeout(poll);
                if state.load(Ordering::Acquire) == WAITING && abandon() {
                    if state.load(Ordering::Acquire) == WAITING {
                        // Still out: the sender keeps this cell (`reply_to`
                        // takes a fresh one next time).
                        return None;
                    }
                    break;
                }
            }
        }
        self.take()
    }

    /// The answer, the state `FULL` or `CLOSED`: the cell is ours again.
    fn take(&mut self) -> Option<T> {
        let state = self.cell.state.load(Ordering::Acquire);
        debug_assert!(state >= FULL, "taken before the answer");
        // SAFETY: the state says the sender is done with the cell (its swap
        // was its last touch, and we acquired it); no other waiter exists.
        let answer = self
            .cell
            .answer
            .with_mut(|answer| unsafe { (*answer).take() });
        self.cell.state.store(EMPTY, Ordering::Relaxed);
        self.outstanding = false;
        if state == CLOSED { None } else { answer }
    }
}

impl<T> ReplyTo<T> {
    /// Answer; the waiter wakes.
    pub(crate) fn send(mut self, answer: T) {
        // SAFETY: this is the cell's one outstanding sender and the waiter
        // reads the answer only after the swap below publishes it.
        self.cell
            .answer
            .with_mut(|slot| unsafe { *slot = Some(answer) });
        self.finish(FULL);
    }

    fn finish(&mut self, state: usize) {
        self.done = true;
        if self.cell.state.swap(state, Ordering::AcqRel) == WAITING {
            self.waiter.unpark();
        }
    }
}

impl<T> Drop for ReplyTo<T> {
    /// Dropped unanswered (its request refused without a word, or dropped
    /// with a channel): the waiter wakes to no answer.
    fn drop(&mut self) {
        if !self.done {
            self.finish(CLOSED);
        }
    }
}

#[cfg(all(test, not(streamalloc_loom)))]
mod tests {
    use super::*;

    const POLL: Duration = Duration::from_millis(1);

    #[test]
    fn an_answer_sent_before_the_wait_is_taken() {
        let mut cell = ReplyCell::new();
        cell.reply_to().send(7);
        assert_eq!(cell.wait(&AdaptiveSpin::new(0), POLL, || false), Some(7));
    }

    #[test]
    fn an_answer_from_another_thread_wakes_a_parked_waiter() {
        let mut cell = ReplyCell::new();
        for round in 0..1000 {
            let to = cell.reply_to();
            let sender = std::thread::spawn(move || to.send(round));
            // No spin: straight to the announcement and the park.
            assert_eq!(
                cell.wait(&AdaptiveSpin::new(0), POLL, || false),
                Some(round)
            );
            sender.join().unwrap();
        }
    }

    #[test]
    fn a_sender_dropped_unanswered_says_no_answer_will_come() {
        let mut cell = ReplyCell::<u32>::new();
        let to = cell.reply_to();
        std::thread::spawn(move || drop(to)).join().unwrap();
        assert_eq!(cell.wait(&AdaptiveSpin::new(0), POLL, || false), None);
        // The cell is ours again: the next answer arrives.
        cell.reply_to().send(3);
        assert_eq!(cell.wait(&AdaptiveSpin::new(8), POLL, || false), Some(3));
    }

    #[test]
    fn an_abandoned_wait_leaves_its_cell_to_the_late_sender() {
        let mut cell = ReplyCell::new();
        let late = cell.reply_to();
        assert_eq!(cell.wait(&AdaptiveSpin::new(0), POLL, || true), None);
        // The next sender writes to a fresh cell; the late answer goes
        // to the old one and drops with it.
        let next = cell.reply_to();
        late.send(1);
        next.send(2);
        assert_eq!(cell.wait(&AdaptiveSpin::new(0), POLL, || false), Some(2));
    }

    #[test]
    fn the_spin_budget_covers_what_it_catches_and_decays_on_parks() {
        let spin = AdaptiveSpin::new(1024);
        let budget = |spin: &AdaptiveSpin| spin.budget.load(Ordering::Relaxed);
        assert_eq!(budget(&spin), 1024);
        // Parks take an eighth off, down to the floor.
        for _ in 0..62 {
            assert!(!spin.spin(|| false));
        }
        assert_eq!(budget(&spin), SPIN_FLOOR);
        // The 64th parking wait probes the whole most: an answer after 100
        // attempts is caught, and the budget covers twice that.
        let mut tries = 0;
        assert!(!spin.spin(|| false));
        assert!(spin.spin(|| {
            tries += 1;
            tries > 100
        }));
        assert_eq!(budget(&spin), 2 * 100 + SPIN_FLOOR);
        // A quick catch does not lower it.
        assert!(spin.spin(|| true));
        assert_eq!(budget(&spin), 2 * 100 + SPIN_FLOOR);
        // A most below the floor is the floor.
        let short = AdaptiveSpin::new(8);
        assert!(short.spin(|| true) && !short.spin(|| false));
        assert_eq!(budget(&short), 8);
        let never = AdaptiveSpin::new(0);
        assert!(!never.spin(|| false));
        assert_eq!(budget(&never), 0);
    }
}
