//! `[telemetry]` (SPEC OBS-5): defaults, and every bad setting a located
//! error naming the setting.

use std::time::Duration;

use super::*;
use crate::auth::{hash_key, to_hex};

const FILE: &str = "gw.toml";

fn with_telemetry(table: &str) -> String {
    format!(
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         [tenants.t]\nkeys_sha256 = [\"{}\"]\n[models.m]\nprovider = \"p\"\n\
         [telemetry]\n{table}\n",
        to_hex(&hash_key("sk-t"))
    )
}

fn ok(table: &str) -> TelemetryConfig {
    match GatewayConfig::from_toml(&with_telemetry(table), FILE) {
        Ok(c) => c.telemetry,
        Err(e) => panic!("expected a valid [telemetry], got: {e}"),
    }
}

/// The error for `table`: at `field`, on `line` of the file, with `reason`.
fn fail_at(table: &str, field: &str, reason: &str) {
    let text = with_telemetry(table);
    let e = match GatewayConfig::from_toml(&text, FILE) {
        Ok(_) => panic!("expected an error for {table:?}"),
        Err(e) => e,
    };
    assert_eq!(e.field.as_deref(), Some(field), "{e}");
    assert!(e.reason.contains(reason), "{e}");
    let line = text
        .lines()
        .position(|l| l.starts_with(field.trim_start_matches("telemetry.")))
        .map(|i| i + 1)
        .expect("the setting's line");
    assert!(
        e.to_string().contains(&format!("(line {line}, column")),
        "located at line {line}: {e}"
    );
}

// proves: OBS-5 (tracing is off unless configured; the documented defaults)
#[test]
fn telemetry_defaults_to_off() {
    let c = GatewayConfig::from_toml(&with_telemetry(""), FILE)
        .map(|c| c.telemetry)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c, TelemetryConfig::default());
    assert_eq!(c.endpoint, None);
    assert_eq!(c.sample_ratio, 1.0);
    assert_eq!(c.queue_size, 2048);
    assert_eq!(c.batch_size, 512);
    assert_eq!(c.schedule_delay, Duration::from_secs(1));
    let set = ok(
        "endpoint = \"http://collector:4318\"\nprotocol = \"http/protobuf\"\n\
                  service_name = \"edge\"\nsample_ratio = 0.25\nqueue_size = 100\n\
                  batch_size = 500\nschedule_delay = \"50ms\"\nexport_timeout = \"2s\"",
    );
    assert_eq!(set.endpoint.as_deref(), Some("http://collector:4318"));
    assert_eq!(set.service_name.as_deref(), Some("edge"));
    assert_eq!(set.sample_ratio, 0.25);
    assert_eq!(set.batch_size, 100, "a batch is at most the queue");
    assert_eq!(set.export_timeout, Duration::from_secs(2));
}

// proves: OBS-5 (a bad [telemetry] setting is a located configuration error)
#[test]
fn bad_telemetry_settings_are_located() {
    fail_at(
        "endpoint = \"collector:4318\"",
        "telemetry.endpoint",
        "http://",
    );
    fail_at("endpoint = \"http://\"", "telemetry.endpoint", "");
    fail_at(
        "endpoint = \"not a url\"",
        "telemetry.endpoint",
        "not a URL",
    );
    fail_at("protocol = \"grpc\"", "telemetry.protocol", "http/protobuf");
    fail_at(
        "sample_ratio = 1.5",
        "telemetry.sample_ratio",
        "outside 0..1",
    );
    fail_at(
        "sample_ratio = -0.1",
        "telemetry.sample_ratio",
        "outside 0..1",
    );
    fail_at("queue_size = 0", "telemetry.queue_size", "at least 1");
    fail_at(
        "schedule_delay = \"soon\"",
        "telemetry.schedule_delay",
        "not a duration",
    );
    fail_at("service_name = \" \"", "telemetry.service_name", "empty");
    fail_at("colour = \"blue\"", "telemetry.colour", "unknown");
}

// proves: OBS-5 (the standard variables apply when the file is silent; the file wins; a bad variable is an error)
#[test]
fn environment_variables_fill_what_the_file_leaves() {
    use crate::telemetry::{Resolved, resolve};
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let off = TelemetryConfig::default();
    assert_eq!(resolve(&off, env(&[])).ok(), Some(None), "off by default");
    let from_env = resolve(
        &off,
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318/"),
            ("OTEL_SERVICE_NAME", "from-env"),
        ]),
    );
    assert_eq!(
        from_env.ok().flatten(),
        Some(Resolved {
            traces_url: "http://otel:4318/v1/traces".into(),
            service_name: "from-env".into()
        })
    );
    let file = ok("endpoint = \"http://file:4318\"\nservice_name = \"file\"");
    let both = resolve(
        &file,
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
            ("OTEL_SERVICE_NAME", "from-env"),
        ]),
    );
    assert_eq!(
        both.ok().flatten(),
        Some(Resolved {
            traces_url: "http://file:4318/v1/traces".into(),
            service_name: "file".into()
        })
    );
    let bad = resolve(&off, env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "otel:4318")]));
    let e = bad.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT: "), "{e}");
}
