//! The mbTLS services' session reports as JSON objects (`--report-format json`): the facts of
//! each text line as fields a program reads without parsing words. The text line goes along as
//! `text`, since its wording (why a session failed, what would fix it) is for people.

use mbx_mbtls::driver::client::MiddleboxVerdict;
use mbx_mbtls::driver::{
    fingerprint_hex, ConnectionReport, DriverError, Durations, ErrorKind, ProxyReport,
    ServerConnectionReport,
};
use mbx_mbtls::handshake::{HandshakeError, HopFingerprint, SessionSummary};
use mbx_mbtls::Side;
use serde_json::{json, Map, Value};

use crate::mbtls::{exclusion_text, verdict_text, version_name};
use mbx_mbtls::driver::in_path_order;

/// A middlebox's connection.
pub fn middlebox(r: &ConnectionReport) -> Map<String, Value> {
    let mut m = object(json!({
        "role": "middlebox",
        "id": r.id,
        "client": r.client.map(|a| a.to_string()),
        "next_hop": r.next_hop,
        "next_hop_local": r.next_hop_local.map(|a| a.to_string()),
        "announced": r.announced,
        // "joined" as the text line says it: key material arrived.
        "joined": r.keys_installed,
        "secondary_session_started": r.joined,
        "evidence_sent": r.evidence_sent,
        // Its secondary session with the endpoint, when one started.
        "resumed": r.joined.then_some(r.resumed),
        "legacy_server": r.legacy_server,
        "passive": r.passive,
        // How its app ended the session, if it did (also after an orderly close_notify).
        "app_ended": r.app_ended,
        "refused_by_endpoint": r.refused_by_endpoint,
        "version": r.version.map(version_name),
        "client_hop": r.client_hop.as_ref().map(hop),
        "server_hop": r.server_hop.as_ref().map(hop),
        "bytes_from_client": r.bytes_from_client,
        "bytes_from_server": r.bytes_from_server,
        // Unseen by a middlebox without its keys (it stood aside, or the session ended
        // before them): it forwarded records it could not read.
        "key_updates": r.keys_installed.then_some(r.key_updates),
        // Known only on a session that ended without an error (the error says the rest)
        // and that the middlebox could read (a close_notify is encrypted): who left after
        // the other's close_notify without its own, or "none".
        "left_without_close_notify": (r.outcome.is_ok() && r.keys_installed).then_some(
            match r.left_without_close_notify {
                Some(Side::Client) => "client",
                Some(Side::Server) => "server",
                None => "none",
            }
        ),
    }));
    outcome(
        &mut m,
        &r.outcome,
        &r.durations,
        (r.cut_at_stop, r.error_kind),
    );
    m
}

/// A server's session.
pub fn server(r: &ServerConnectionReport) -> Map<String, Value> {
    let mut m = object(json!({
        "role": "server",
        "id": r.id,
        "peer": r.peer.map(|a| a.to_string()),
        "bytes_to_backend": r.bytes_to_backend,
        "bytes_from_backend": r.bytes_from_backend,
        "key_updates": r.key_updates,
    }));
    session(&mut m, r.summary.as_ref(), &r.verdicts);
    left(&mut m, &r.outcome, r.peer_left_without_close_notify);
    failed_on(&mut m, r.error.as_deref());
    outcome(
        &mut m,
        &r.outcome,
        &r.durations,
        (r.cut_at_stop, r.error_kind()),
    );
    m
}

/// A client proxy's connection.
pub fn proxy(r: &ProxyReport) -> Map<String, Value> {
    let mut m = object(json!({
        "role": "client-proxy",
        "id": r.id,
        "local_peer": r.local_peer.map(|a| a.to_string()),
        "first_hop_local": r.first_hop_local.map(|a| a.to_string()),
        "connected": r.connected,
        "bytes_up": r.bytes_up,
        "bytes_down": r.bytes_down,
        "key_updates": r.key_updates,
    }));
    session(&mut m, r.summary.as_ref(), &r.verdicts);
    left(&mut m, &r.outcome, r.peer_left_without_close_notify);
    failed_on(&mut m, r.error.as_deref());
    outcome(
        &mut m,
        &r.outcome,
        &r.durations,
        (r.cut_at_stop, r.error_kind()),
    );
    m
}

/// What an endpoint knows of its session: version, suite, hops in path order from the client
/// (empty: the keys stayed in OpenSSL), its side's middleboxes and its verdicts on them.
fn session(m: &mut Map<String, Value>, summary: Option<&SessionSummary>, v: &[MiddleboxVerdict]) {
    let path = summary
        .map(|s| s.middleboxes.as_slice())
        .unwrap_or_default();
    // Null where the handshake did not get that far (an empty list of hops is a session
    // whose keys stayed in OpenSSL).
    m.extend(object(json!({
        "version": summary.map(|s| version_name(s.version)),
        "suite": summary.map(|s| s.suite.name()),
        "resumed": summary.map(|s| s.resumed),
        "hops": summary.map(|s| s.hops.iter().map(hop).collect::<Vec<_>>()),
        "middleboxes": summary.map(|_| path),
        "verdicts": in_path_order(v, path).into_iter().map(verdict).collect::<Vec<_>>(),
    })));
}

fn verdict(v: &MiddleboxVerdict) -> Value {
    let text = verdict_text(v, true);
    match v {
        MiddleboxVerdict::Verified {
            middlebox,
            claims,
            resumed,
            checked_at,
            evidence_in_certificate,
        } => json!({
            "middlebox": middlebox,
            "verdict": "verified",
            "resumed": resumed,
            "checked_at": checked_at,
            "evidence_in_certificate": evidence_in_certificate,
            "claims": claims.as_ref().map(|c| json!({
                "tee": c.tee.to_string(),
                "measurement": hex::encode(&c.measurement),
                "signer": hex::encode(&c.signer),
                "product_id": c.product_id,
                "svn": c.svn,
                "debug": c.debug,
                "tcb_status": c.tcb_status.as_ref().map(ToString::to_string),
                "advisory_ids": c.advisory_ids,
                "tcb_evaluation_data_number": c.tcb_evaluation_data_number,
            })),
            "text": text,
        }),
        MiddleboxVerdict::Excluded {
            middlebox,
            why,
            detail,
        } => json!({
            "middlebox": middlebox,
            "verdict": "excluded",
            "why": exclusion_text(why),
            "detail": detail,
            "text": text,
        }),
        MiddleboxVerdict::Direct => json!({ "verdict": "direct", "text": text }),
    }
}

/// A hop's key fingerprints, as the text lines show them.
fn hop(h: &HopFingerprint) -> Value {
    json!({ "c2s": fingerprint_hex(&h.c2s), "s2c": fingerprint_hex(&h.s2c) })
}

/// Whether the peer left after our close_notify without its own, on a session that otherwise
/// ended well; null on one that failed, whose error says how it ended.
fn left(m: &mut Map<String, Value>, outcome: &Result<(), String>, left: bool) {
    let known = outcome.is_ok().then_some(left);
    m.insert("peer_left_without_close_notify".into(), known.into());
}

/// The middlebox the session failed on at this endpoint (refused for its certificate,
/// approval or evidence, or its secondary session broke), which then has no verdict; null when
/// the failure names none.
fn failed_on(m: &mut Map<String, Value>, error: Option<&DriverError>) {
    let name = match error {
        Some(DriverError::Handshake(HandshakeError::Middlebox { name, .. })) => Some(name.as_str()),
        _ => None,
    };
    m.insert("failed_on_middlebox".into(), name.into());
}

/// How the connection ended, and how long it took (milliseconds to the microsecond, from the
/// accept: `handshake_ms` until this party's handshake was over, null if it never was). The
/// error's kind: the driver's ([`DriverError::kind`]), else `"cut_at_stop"` for a connection
/// the stop cut, else `"other"`; null when it ended well.
fn outcome(
    m: &mut Map<String, Value>,
    outcome: &Result<(), String>,
    took: &Durations,
    (cut_at_stop, kind): (bool, Option<ErrorKind>),
) {
    let ms = |d: std::time::Duration| d.as_micros() as f64 / 1000.0;
    m.insert("handshake_ms".into(), took.handshake.map(ms).into());
    m.insert("duration_ms".into(), ms(took.total).into());
    let kind = outcome.is_err().then(|| {
        kind.map_or(
            if cut_at_stop { "cut_at_stop" } else { "other" },
            ErrorKind::name,
        )
    });
    m.insert("cut_at_stop".into(), cut_at_stop.into());
    m.insert("error_kind".into(), kind.into());
    m.insert("ok".into(), outcome.is_ok().into());
    m.insert(
        "error".into(),
        outcome.as_ref().err().map(String::as_str).into(),
    );
}

/// A JSON object's fields.
pub(crate) fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mbx_attest::{Claims, TcbStatus, TeeKind};

    fn claims() -> Claims {
        Claims {
            tee: TeeKind::Sgx,
            measurement: vec![0xab; 32],
            signer: vec![0xcd; 32],
            product_id: 3,
            svn: 2,
            debug: false,
            tcb_status: Some(TcbStatus::SWHardeningNeeded),
            advisory_ids: vec!["INTEL-SA-00615".into()],
            tcb_evaluation_data_number: Some(17),
            platform_key: None,
            collateral_valid_until: None,
            collateral_issued_at: None,
        }
    }

    /// A server's session with its two middleboxes, listed in path order (the verdicts came
    /// in another), each verdict with its facts: the verified one's claims in hex, the
    /// excluded one's reason; the summary's version, suite and hops.
    #[test]
    fn a_servers_session_gives_its_verdicts_in_path_order_with_their_facts() {
        let hop_of = |b: u8| HopFingerprint {
            c2s: [b; 8],
            s2c: [b + 1; 8],
        };
        let r = ServerConnectionReport {
            id: 4,
            peer: Some("127.0.0.1:4000".parse().unwrap()),
            verdicts: vec![
                MiddleboxVerdict::Excluded {
                    middlebox: Some("mb2.test".into()),
                    why: "evidence refused",
                    detail: Some("measurement not accepted".into()),
                },
                MiddleboxVerdict::Verified {
                    middlebox: "mb1.test".into(),
                    claims: Some(claims()),
                    resumed: true,
                    checked_at: 1_700_000_000,
                    evidence_in_certificate: false,
                },
            ],
            summary: Some(SessionSummary {
                version: mbx_record::TlsVersion::Tls12,
                suite: mbx_record::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                hops: vec![hop_of(1), hop_of(3)],
                middleboxes: vec!["mb1.test".into(), "mb2.test".into()],
                resumed: false,
            }),
            bytes_to_backend: 10,
            bytes_from_backend: 20,
            idle_trims: 0,
            key_updates: 1,
            peer_left_without_close_notify: false,
            durations: Durations {
                handshake: Some(std::time::Duration::from_micros(2_500)),
                total: std::time::Duration::from_millis(1_250),
            },
            cut_at_stop: false,
            outcome: Err("the backend left".into()),
            error: Some(std::sync::Arc::new(DriverError::Handshake(
                HandshakeError::Middlebox {
                    name: "mb3.test".into(),
                    inner: Box::new(HandshakeError::Protocol("test")),
                },
            ))),
        };
        let v = Value::Object(server(&r));
        assert_eq!(v["role"], "server");
        assert_eq!(v["peer"], "127.0.0.1:4000");
        assert_eq!(
            (&v["handshake_ms"], &v["duration_ms"]),
            (&json!(2.5), &json!(1250.0))
        );
        assert_eq!(
            (&v["error_kind"], &v["cut_at_stop"]),
            (&json!("handshake"), &json!(false))
        );
        assert_eq!(v["version"], "TLS 1.2");
        assert_eq!(v["suite"], "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384");
        assert_eq!(
            v["hops"],
            json!([
                {"c2s": "0101010101010101", "s2c": "0202020202020202"},
                {"c2s": "0303030303030303", "s2c": "0404040404040404"}
            ])
        );
        assert_eq!(v["middleboxes"], json!(["mb1.test", "mb2.test"]));
        let first = &v["verdicts"][0];
        assert_eq!(first["middlebox"], "mb1.test");
        assert_eq!(first["verdict"], "verified");
        assert_eq!(first["resumed"], true);
        assert_eq!(first["checked_at"], 1_700_000_000u64);
        assert_eq!(first["claims"]["tee"], "sgx");
        assert_eq!(first["claims"]["measurement"], "ab".repeat(32));
        assert_eq!(first["claims"]["signer"], "cd".repeat(32));
        assert_eq!(first["claims"]["svn"], 2);
        assert_eq!(
            first["claims"]["tcb_status"],
            TcbStatus::SWHardeningNeeded.to_string()
        );
        assert_eq!(first["claims"]["advisory_ids"], json!(["INTEL-SA-00615"]));
        assert!(first["text"]
            .as_str()
            .unwrap()
            .starts_with("mb1.test verified (sgx TEE"));
        let second = &v["verdicts"][1];
        assert_eq!(second["verdict"], "excluded");
        assert_eq!(second["why"], "evidence refused");
        let mut allowed = r.clone();
        allowed.verdicts = vec![MiddleboxVerdict::Excluded {
            middlebox: None,
            why: mbx_mbtls::handshake::NOT_APPROVED,
            detail: None,
        }];
        allowed.outcome = Ok(());
        allowed.error = None;
        let v2 = Value::Object(server(&allowed));
        // As the text line says it: the CLI's approval is its allow-list.
        assert_eq!(
            v2["verdicts"][0]["why"],
            "not in the allow-list (--allow-middlebox)"
        );
        assert_eq!(v2["verdicts"][0].get("middlebox"), Some(&Value::Null));
        assert_eq!(v2.get("failed_on_middlebox"), Some(&Value::Null));
        assert_eq!(v2["peer_left_without_close_notify"], false);
        // Before the handshake got that far: nulls, not an empty path.
        let mut early = allowed.clone();
        early.summary = None;
        let v3 = Value::Object(server(&early));
        for key in ["version", "suite", "resumed", "hops", "middleboxes"] {
            assert_eq!(v3.get(key), Some(&Value::Null), "{key}: {v3}");
        }
        assert_eq!(second["detail"], "measurement not accepted");
        assert_eq!(
            (&v["ok"], &v["error"]),
            (&json!(false), &json!("the backend left"))
        );
        // Not known on a failed session: the error says how it ended.
        assert_eq!(v.get("peer_left_without_close_notify"), Some(&Value::Null));
        assert_eq!(v["failed_on_middlebox"], "mb3.test");
        assert_eq!(v["key_updates"], 1);
    }

    /// A middlebox that never got keys: no version, hops, resumption or KeyUpdate count
    /// (nulls, not absent fields), why it stood aside, and who left without close_notify.
    #[test]
    fn a_middleboxs_connection_without_keys_has_nulls_where_it_knows_nothing() {
        let r = ConnectionReport {
            id: 1,
            client: None,
            next_hop: Some("127.0.0.1:9".into()),
            next_hop_local: None,
            announced: true,
            legacy_server: false,
            joined: false,
            evidence_sent: false,
            resumed: false,
            keys_installed: false,
            app_ended: None,
            passive: Some("the server did not answer our announcement"),
            refused_by_endpoint: None,
            version: None,
            client_hop: None,
            server_hop: None,
            bytes_from_client: 5,
            bytes_from_server: 6,
            idle_trims: 0,
            key_updates: 0,
            left_without_close_notify: Some(Side::Server),
            durations: Durations::default(),
            cut_at_stop: false,
            error_kind: None,
            outcome: Ok(()),
        };
        let v = Value::Object(middlebox(&r));
        assert_eq!(v["role"], "middlebox");
        for key in [
            "client",
            "version",
            "client_hop",
            "server_hop",
            "error",
            "handshake_ms",
            "error_kind",
            // No secondary session to have resumed; KeyUpdates and close_notify unseen,
            // standing aside (thirty-third round: "none" for the latter, which it cannot
            // know, found in an operator trial).
            "resumed",
            "key_updates",
            "left_without_close_notify",
        ] {
            assert_eq!(v.get(key), Some(&Value::Null), "{key}: {v}");
        }
        // Known once a secondary session started, and once its keys came.
        let mut took_part = r.clone();
        (took_part.joined, took_part.passive) = (true, None);
        assert_eq!(middlebox(&took_part)["resumed"], json!(false));
        took_part.keys_installed = true;
        let v2 = middlebox(&took_part);
        assert_eq!(v2["key_updates"], json!(0));
        assert_eq!(v2["left_without_close_notify"], "server");
        assert_eq!(v["cut_at_stop"], false, "{v}");
        assert_eq!(v["passive"], "the server did not answer our announcement");
        let mut both_closed = took_part.clone();
        both_closed.left_without_close_notify = None;
        assert_eq!(middlebox(&both_closed)["left_without_close_notify"], "none");
        let mut failed = took_part.clone();
        failed.outcome = Err("cut".into());
        assert_eq!(
            middlebox(&failed).get("left_without_close_notify"),
            Some(&Value::Null)
        );
        assert_eq!((&v["ok"], &v["announced"]), (&json!(true), &json!(true)));
        assert_eq!(
            (&v["joined"], &v["secondary_session_started"]),
            (&json!(false), &json!(false))
        );
        assert!(v.get("keys_installed").is_none(), "{v}");
    }
}
