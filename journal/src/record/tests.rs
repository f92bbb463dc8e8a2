//! The format's round trips, its compactness and its refusals.

use super::*;

fn one(buf: &[u8], salt: u32) -> Rec<'_> {
    let (payload, _) = read_frame(buf, 0, salt).expect("intact");
    decode(payload, FORMAT_VERSION).expect("decodes")
}

#[test]
fn frame_round_trip_and_salt_binds_records_to_their_file() {
    let mut buf = Vec::new();
    let ids = [("a", 1i64), ("bb", -2)];
    frame(&mut buf, 7, &Rec::Started(Ids::Borrowed(&ids))).expect("small record");
    let (payload, next) = read_frame(&buf, 0, 7).expect("intact");
    assert_eq!(next, buf.len());
    match decode(payload, FORMAT_VERSION).expect("decodes") {
        Rec::Started(got) => assert_eq!(got.iter().collect::<Vec<_>>(), ids),
        other => panic!("wrong record {other:?}"),
    }
    assert!(read_frame(&buf, 0, 8).is_none(), "another file's salt");
}

/// Ids in the execution-id form are stored by their parts and come back
/// byte for byte; any other text comes back as it was.
#[test]
fn ids_round_trip_compact_or_as_text() {
    let ids = [
        (
            "plant-a/press/v7/stamp/1796000000000000000/a1",
            1_796_000_000_000_000_000i64,
        ),
        (
            "plant-a/press/v7/stamp/1796000000001000000/a1",
            1_796_000_000_001_000_000,
        ),
        (
            "plant-a/press/v7/stamp/1796000000000000000/a2",
            1_796_000_000_300_000_000,
        ),
        ("plant-a/press/v7/other/-5/a3", -5),
        ("t/p/v1/i/0/a1", 0),
        // Not canonical: kept as text.
        ("t/p/v1/i/007/a1", 7),
        ("t/p/v1/i/7/a01", 7),
        ("t/p/v1/i/-0/a1", 0),
        ("t/p/v1/i/7/b1", 7),
        ("on_failure/t/p/i/5", 5),
        ("/5/a1", 5),
        ("", i64::MIN),
        ("t/p/v1/i/9223372036854775807/a4294967295", i64::MAX),
    ];
    let mut buf = Vec::new();
    frame(&mut buf, 1, &Rec::Started(Ids::Borrowed(&ids))).expect("small record");
    match one(&buf, 1) {
        Rec::Started(got) => assert_eq!(got.iter().collect::<Vec<_>>(), ids),
        other => panic!("wrong record {other:?}"),
    }
    let results: Vec<Result1<'_>> = ids
        .iter()
        .zip(
            [Outcome::Succeeded, Outcome::Failed, Outcome::NotRun]
                .iter()
                .cycle(),
        )
        .map(|((id, ns), o)| (Cow::Borrowed(*id), *ns, *o))
        .collect();
    let mut buf = Vec::new();
    frame(&mut buf, 1, &Rec::Finished(results.clone())).expect("small record");
    match one(&buf, 1) {
        Rec::Finished(got) => assert_eq!(got, results),
        other => panic!("wrong record {other:?}"),
    }
}

/// What a firing costs in the log: its start among a pass's batch,
/// its result in the pass's `Finished` batch.
#[test]
fn a_pass_of_firings_is_a_few_bytes_each() {
    let ids: Vec<String> = (0..50)
        .map(|k| {
            format!(
                "default/k1/v1/i{}/{}/a1",
                k % 10,
                1_796_000_000_000_000_000i64 + k * 1_000_000
            )
        })
        .collect();
    let started: Vec<(&str, i64)> = ids
        .iter()
        .enumerate()
        .map(|(k, id)| {
            (
                id.as_str(),
                1_796_000_000_000_000_000i64 + k as i64 * 1_000_000,
            )
        })
        .collect();
    let mut buf = Vec::new();
    frame(&mut buf, 1, &Rec::Started(Ids::Borrowed(&started))).expect("small record");
    assert!(buf.len() / 50 <= 10, "{} bytes per start", buf.len() / 50);
    let mut b = FinishedBatch::default();
    for (id, ns) in &started {
        b.push(id, *ns, Outcome::Succeeded);
    }
    let expect = b.frame_len();
    let mut buf = Vec::new();
    b.seal(&mut buf, 1).expect("small");
    assert_eq!(buf.len(), expect, "frame_len is exact");
    assert!(b.is_empty(), "sealed");
    assert!(buf.len() / 50 <= 10, "{} bytes per result", buf.len() / 50);
    match one(&buf, 1) {
        Rec::Finished(got) => assert_eq!(got.len(), 50),
        other => panic!("wrong record {other:?}"),
    }
}

/// Version-2 records (fixed-width fields, one result per record) still
/// decode: an old log is read, then rewritten.
#[test]
fn version_2_records_decode() {
    let mut started = vec![K_STARTED];
    started.extend_from_slice(&1u32.to_le_bytes());
    started.extend_from_slice(&3u32.to_le_bytes());
    started.extend_from_slice(b"a/b");
    started.extend_from_slice(&(-2i64).to_le_bytes());
    assert!(matches!(
        decode(&started, 2),
        Ok(Rec::Started(ids)) if ids.iter().collect::<Vec<_>>() == [("a/b", -2)]
    ));
    let mut fin = vec![K_FINISHED];
    fin.extend_from_slice(&3u32.to_le_bytes());
    fin.extend_from_slice(b"a/b");
    fin.extend_from_slice(&9i64.to_le_bytes());
    fin.push(OUTCOME_NOT_RUN);
    assert!(matches!(
        decode(&fin, 2),
        Ok(Rec::Finished(r)) if r == [(Cow::Borrowed("a/b"), 9, Outcome::NotRun)]
    ));
    let mut push = vec![K_PUSH];
    push.extend_from_slice(&4u64.to_le_bytes());
    push.extend_from_slice(&2u64.to_le_bytes());
    push.extend_from_slice(&2u32.to_le_bytes());
    push.extend_from_slice(b"{}");
    assert!(matches!(
        decode(&push, 2),
        Ok(Rec::Push {
            seq: 4,
            dropped_through: 2,
            record: b"{}"
        })
    ));
    let mut meta = vec![K_META];
    meta.extend_from_slice(&7u64.to_le_bytes());
    meta.extend_from_slice(&1u64.to_le_bytes());
    meta.push(1);
    meta.extend_from_slice(&5i64.to_le_bytes());
    assert!(matches!(
        decode(&meta, 2),
        Ok(Rec::Meta {
            next_seq: 7,
            dropped: 1,
            last_alive_ns: Some(5),
            carrier: None
        })
    ));
}

#[test]
fn typed_records_round_trip_and_unknown_tags_are_refused() {
    for outcome in [Outcome::Succeeded, Outcome::Failed, Outcome::NotRun] {
        let mut buf = Vec::new();
        let rec = Rec::Finished(vec![(Cow::Borrowed("p/1/i/0/0/1"), -5, outcome)]);
        frame(&mut buf, 3, &rec).expect("small record");
        let (payload, _) = read_frame(&buf, 0, 3).expect("intact");
        match decode(payload, FORMAT_VERSION).expect("decodes") {
            Rec::Finished(got) => {
                assert_eq!(got, [(Cow::Borrowed("p/1/i/0/0/1"), -5, outcome)])
            }
            other => panic!("wrong record {other:?}"),
        }
        // The outcome is the last byte: an unknown tag is an error.
        let mut bad = payload.to_vec();
        *bad.last_mut().expect("non-empty") = 9;
        assert!(decode(&bad, FORMAT_VERSION).is_err());
    }
    for reason in [
        StopReason::GiveUp,
        StopReason::Cancel,
        StopReason::LeaseLost,
        StopReason::ClockLost,
    ] {
        let mut buf = Vec::new();
        let rec = Rec::StopPack {
            tenant: "t",
            pack: "p",
            version: 4,
            reason,
        };
        frame(&mut buf, 0, &rec).expect("small record");
        assert!(matches!(
            one(&buf, 0),
            Rec::StopPack { reason: r, version: 4, .. } if r == reason
        ));
    }
    let mut buf = Vec::new();
    frame(
        &mut buf,
        0,
        &Rec::Once {
            key: "k",
            ref_ns: 7,
        },
    )
    .expect("small record");
    assert!(matches!(
        one(&buf, 0),
        Rec::Once {
            key: "k",
            ref_ns: 7
        }
    ));
    for rec in [
        Rec::Push {
            seq: 300,
            dropped_through: 2,
            record: b"\xb1xyz",
        },
        Rec::Ack { up_to_seq: 1 << 40 },
        Rec::Meta {
            next_seq: 9,
            dropped: 3,
            last_alive_ns: Some(-1),
            carrier: Some((5, 2)),
        },
        Rec::DropsSent { seq: 5, count: 2 },
    ] {
        let mut buf = Vec::new();
        frame(&mut buf, 0, &rec).expect("small record");
        assert_eq!(format!("{:?}", one(&buf, 0)), format!("{rec:?}"));
    }
}

/// The session generation round-trips, and a log of version 2 (which
/// never had it) refuses the kind rather than misreading it.
#[test]
fn session_gen_round_trips_in_version_3_only() {
    for generation in [1, 300, u64::MAX] {
        let mut buf = Vec::new();
        frame(&mut buf, 9, &Rec::SessionGen { generation }).expect("small record");
        assert!(matches!(one(&buf, 9), Rec::SessionGen { generation: g } if g == generation));
        let (payload, _) = read_frame(&buf, 0, 9).expect("intact");
        assert!(decode(payload, 2).is_err(), "not a version-2 record");
    }
}

#[test]
fn journal_id_round_trips() {
    let mut buf = Vec::new();
    frame(&mut buf, 5, &Rec::JournalId { id: "00ff" }).expect("small record");
    assert!(matches!(one(&buf, 5), Rec::JournalId { id: "00ff" }));
}

#[test]
fn header_round_trip_and_damage() {
    let h = encode_header(42);
    assert_eq!(decode_header(&h).ok(), Some((42, FORMAT_VERSION)));
    let mut bad = h;
    bad[13] ^= 1;
    assert!(matches!(decode_header(&bad), Err(HeaderError::Checksum)));
    assert!(matches!(decode_header(&h[..5]), Err(HeaderError::Short)));
}

#[test]
fn oversized_record_is_refused_and_leaves_buffer_intact() {
    let mut buf = vec![1, 2, 3];
    let big = vec![0u8; MAX_PAYLOAD];
    let rec = Rec::Push {
        seq: 1,
        dropped_through: 0,
        record: &big,
    };
    assert!(frame(&mut buf, 0, &rec).is_err());
    assert_eq!(buf, [1, 2, 3]);
}
