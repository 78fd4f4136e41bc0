//! Resolve-pin racing relocation: a client pins an allocation through its
//! published address (no round trip) while the actor compacts the page it
//! sits on. No client ever uses an address after the bytes moved away, and
//! a client that pins after the move reads the new address.
//!
//! Fails when `PinWord::try_pin` ignores a move under way, or when
//! `Mover::while_claimed` moves without claiming the allocation (its CAS
//! from 0 pins to moving, `PinWord::claim_move`), or the new address is
//! published after the claim is dropped (`Mover::publish`). The second
//! model is the same race against a slide (`ExpandablePool::slide_slot`:
//! the allocation moved down over the hole below it, overlapping itself).

#![cfg(streamalloc_loom)]

mod common;

use common::{WatchedStorage, run_model, tiny_arena, tiny_pages};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use streamalloc::memory::{Allocation, MemoryConfig, RelocationReason, RelocationReport};
use streamalloc::service::loom_support::{ActorUnderTest, stream_on};
use streamalloc::storage::VirtualStorage;

/// What a model lays out before the race: `x` moves from `old` to `new`
/// if the compaction gets to it; `_kept` stay live (never read).
struct Layout {
    _kept: Vec<Allocation>,
    x: Allocation,
    old: u64,
    new: u64,
}

/// Lay out with `lay_out` on an actor over `inner` (watched), then race a
/// client's resolve-pin of `x` against the actor's compaction; what the
/// compaction reported, with the layout (still live) and the actor.
fn race(
    inner: VirtualStorage,
    config: MemoryConfig,
    lay_out: fn(&mut ActorUnderTest) -> Layout,
) -> (RelocationReport, Layout, ActorUnderTest) {
    let in_use = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicBool::new(false));
    let storage = WatchedStorage {
        inner,
        in_use: in_use.clone(),
        moved: moved.clone(),
    };
    let (handle, mut actor) = stream_on(Box::new(storage), config, 4);
    let layout = lay_out(&mut actor);
    let (client_x, old, new) = (layout.x.clone(), layout.old, layout.new);
    let client = loom::thread::spawn(move || {
        if let Some(pinned) = handle.try_resolve(&client_x).unwrap() {
            in_use.store(true, Ordering::SeqCst);
            let seen_move = moved.load(Ordering::SeqCst);
            let expected = if seen_move { new } else { old };
            assert_eq!(pinned.addr(), expected, "a stale address after a move");
            in_use.store(false, Ordering::SeqCst);
        }
    });
    let report = actor.relocate(RelocationReason::Compaction).unwrap();
    client.join().unwrap();
    let now = actor
        .memory()
        .get_resource(&layout.x, None, None)
        .unwrap()
        .addr;
    if report.moved == 1 {
        assert_eq!(now, new);
    } else {
        assert_eq!(report.skipped_pinned, 1, "only a pin keeps x in place");
        assert_eq!(now, old);
    }
    (report, layout, actor)
}

#[test]
fn resolve_racing_relocation_never_uses_moved_bytes() {
    run_model("resolve racing relocation", || {
        race(VirtualStorage::new(), tiny_pages(), |actor| {
            // Page 0: a (2 KiB) + b (2 KiB). Page 1: x (1 KiB). The actor
            // compacts page 1 into page 0's free half.
            let a = actor.reserve(2048).unwrap();
            let b = actor.reserve(2048).unwrap();
            let x = actor.reserve(1024).unwrap();
            let old = actor.memory().get_resource(&x, None, None).unwrap().addr;
            let new = actor.memory().get_resource(&b, None, None).unwrap().addr;
            drop(b);
            actor.memory().process_releases();
            Layout {
                _kept: vec![a],
                x,
                old,
                new,
            }
        });
    });
}

#[test]
fn resolve_racing_a_slide_never_uses_moved_bytes() {
    run_model("resolve racing a slide", || {
        let arena = VirtualStorage::with_granule(Some(4096));
        let (report, _layout, mut actor) = race(arena, tiny_arena(), |actor| {
            // Granules of 4 KiB: a (1 KiB), b (1 KiB), x (3 KiB) across
            // both. Once b goes, no hole holds x, but x sliding down 1 KiB
            // over it (overlapping itself) leaves the second granule free.
            let a = actor.reserve(1024).unwrap();
            let b = actor.reserve(1024).unwrap();
            let x = actor.reserve(3072).unwrap();
            let old = actor.memory().get_resource(&x, None, None).unwrap().addr;
            drop(b);
            actor.memory().process_releases();
            Layout {
                _kept: vec![a],
                x,
                old,
                new: old - 1024,
            }
        });
        if report.moved == 1 {
            assert_eq!(
                actor.memory().bytes_reserved(),
                4096,
                "the top granule went back"
            );
        }
    });
}
