#![no_main]

#[path = "common.rs"]
mod common;

static QUIET_CAUGHT_PANICS: std::sync::Once = std::sync::Once::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The reader catches serde-pickle's own panics and answers an error;
    // libfuzzer's hook would abort on those caught panics, so it is
    // replaced. A panic that escapes the reader still reaches the macro's
    // catch_unwind and fails the run.
    QUIET_CAUGHT_PANICS.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    common::trace_torch(data)
});
