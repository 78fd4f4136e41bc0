//! What `simulate --plot` draws agrees with what it reports (issue 41,
//! item 11: the report said a peak of 405.79 MiB, the chart topped out near
//! 390, and live was drawn above reserved in places).

use std::time::Duration;
use streamalloc::service::{ServiceConfig, Supervisor};
use streamalloc::simulate::{ModelShape, SimulateOptions, simulate};
use streamalloc::storage::DriverCosts;
use streamalloc::timeline::Timeline;

#[test]
fn the_chart_of_a_simulation_reaches_its_peak_and_never_draws_live_above_reserved() {
    for seed in [1, 2] {
        let supervisor = Supervisor::virtual_device(ServiceConfig::default());
        let options = SimulateOptions {
            model: ModelShape::SMALL,
            streams: 2,
            clients: 4,
            requests: 48,
            max_prompt: 256,
            max_new_tokens: 16,
            seed,
            // Far apart: most of the run happens between two samples.
            sample_every: Some(Duration::from_millis(50)),
            costs: DriverCosts::H200,
        };
        let mut timeline = Timeline::default();
        let report = simulate(&supervisor, &options, || {}, Some(&mut timeline)).unwrap();
        let (reserved_peak, _) = timeline.peaks();
        assert_eq!(
            reserved_peak, report.peak_reserved_bytes,
            "the chart tops out at the reported peak"
        );
        for bucket in &timeline.buckets {
            assert!(
                bucket.live.max <= bucket.reserved.max && bucket.live.min <= bucket.reserved.min,
                "live above reserved: {bucket:?}"
            );
        }
        supervisor.shutdown();
    }
}
