//! Shutdown with a request and a release in flight: the actor runs its real
//! loop on a loom thread; a client reserves while the main thread drops an
//! allocation and shuts the stream down. Nobody hangs (loom reports any
//! deadlock), the client gets an allocation or `StreamStopped`, and every
//! page goes back.
//!
//! Fails when `StreamActor::shutdown` does not call `release_unpinned`
//! (bytes are left), or when a request that reached the inbox as the
//! actor left is refused by nobody (the client waits forever): both halves
//! of that hand-over are guards, the actor's last drain in
//! `StreamShared::set_exited` and the caller's look at the exit flag after
//! its send in `StreamHandle::send_and_wait` (each removal checked).

#![cfg(streamalloc_loom)]

mod common;

use common::{run_model, tiny_pages};
use streamalloc::memory::StreamId;
use streamalloc::service::ServiceError;
use streamalloc::service::loom_support::{shut_down, stream_on};
use streamalloc::storage::VirtualStorage;

#[test]
fn shutdown_with_requests_and_releases_in_flight() {
    run_model("shutdown in flight", || {
        let (handle, mut actor) = stream_on(Box::new(VirtualStorage::new()), tiny_pages(), 2);
        let held = actor.reserve(1024).unwrap();
        let actor_thread = loom::thread::spawn(move || actor.run());
        let client_handle = handle.clone();
        let client = loom::thread::spawn(move || match client_handle.reserve(512) {
            Ok(allocation) => drop(allocation),
            Err(err) => assert_eq!(err, ServiceError::StreamStopped(StreamId(0))),
        });
        drop(held);
        let report = shut_down(&handle).unwrap();
        assert_eq!(report.bytes_left, 0, "pages left after shutdown");
        client.join().unwrap();
        actor_thread.join().unwrap();
        assert!(matches!(
            handle.reserve(1),
            Err(ServiceError::StreamStopped(_))
        ));
    });
}
