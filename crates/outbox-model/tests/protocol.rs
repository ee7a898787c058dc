//! Model checks of the relay's window/position protocol: the fixed protocol keeps every
//! property over the whole state space of each configuration, and each planted bug is found.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Instant;

use outbox_model::properties::{FAILED_HELD, NEVER_BACKWARDS, NO_LOSS, NO_OVERTAKING};
use outbox_model::{Action, Bugs, Config, ProtocolModel};
use stateright::{Checker, HasDiscoveries, Model, Path};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Explores the whole state space of `cfg` and asserts every `always` property holds and every
/// example is reached. Returns the number of distinct states.
fn check_whole(name: &str, cfg: Config) -> usize {
    let started = Instant::now();
    let checker = ProtocolModel::new(cfg)
        .checker()
        .threads(threads())
        .spawn_bfs()
        .join();
    let states = checker.unique_state_count();
    println!(
        "{name}: {states} states, depth {}, {:.1?}",
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
    states
}

/// Searches `cfg` breadth-first until `property` has a counterexample, and returns the
/// (shortest) path to it, printed.
fn find(name: &str, cfg: Config, property: &'static str) -> Path<outbox_model::State, Action> {
    let started = Instant::now();
    let model = ProtocolModel::new(cfg);
    let checker = model
        .clone()
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("{name}: no counterexample to {property:?}"));
    println!(
        "{name}: counterexample to {property:?} after {} states, {:.1?}, {} steps:\n{}",
        checker.unique_state_count(),
        started.elapsed(),
        path.clone().into_actions().len(),
        model.explain(&path)
    );
    path
}

#[test]
fn the_fixed_protocol_keeps_every_property() {
    for (name, cfg) in Config::portfolio() {
        let states = check_whole(name, cfg);
        // A model that got nowhere would pass too: each configuration has hundreds of thousands
        // of states, and `assert_properties` has already required every example to be reached.
        assert!(states > 100_000, "{name}: only {states} states");
    }
}

#[test]
fn the_fixed_protocol_keeps_every_property_with_parking_and_pruning() {
    for (name, cfg) in Config::parking_portfolio() {
        let states = check_whole(name, cfg);
        assert!(states > 100_000, "{name}: only {states} states");
    }
}

#[test]
fn an_unlocked_floor_read_loses_a_row() {
    let cfg = Config {
        bugs: Bugs {
            unlocked_floor: true,
            ..Bugs::default()
        },
        ..Config::writers_race()
    };
    let path = find("unlocked floor", cfg, NO_LOSS);
    // The loss comes from a floor read in the middle of a draw.
    let actions = path.clone().into_actions();
    let states = path.into_states();
    assert!(actions
        .iter()
        .zip(&states)
        .any(|(a, s)| matches!(a, Action::ReadFloor { .. }) && s.sequence.drawing.is_some()));
}

#[test]
fn a_late_landing_record_moves_the_position_back() {
    let cfg = Config {
        bugs: Bugs {
            latest_by_highest_id: true,
            ..Bugs::default()
        },
        ..Config::abandoned_records()
    };
    let path = find("latest by highest id", cfg, NEVER_BACKWARDS);
    let actions = path.into_actions();
    assert!(actions.iter().any(|a| matches!(a, Action::Abandon { .. })));
}

#[test]
fn a_walk_that_hands_out_rows_past_the_end_of_its_span_loses_a_row() {
    let cfg = Config {
        bugs: Bugs {
            rows_past_the_span: true,
            ..Bugs::default()
        },
        ..Config::walk_span()
    };
    let path = find("rows past the span handed out", cfg, NO_LOSS);
    assert!(path
        .into_actions()
        .iter()
        .any(|a| matches!(a, Action::Claim { .. })));
}

#[test]
fn the_a3_safety_net_hides_the_unlocked_floor() {
    // Why A3 found rows in production: with the floor read unlocked, every row A2 skips is one
    // A3 returns, so nothing was lost; with the floor read under the lock, A3 has nothing to do
    // (the fixed protocol keeps every property without it).
    let cfg = Config {
        safety_net: true,
        bugs: Bugs {
            unlocked_floor: true,
            ..Bugs::default()
        },
        ..Config::writers_race()
    };
    check_whole("unlocked floor under the A3 net", cfg);
}

/// The engine review's N2 as it was at e1632a8: the CDC relay parked at fresh seqs, polling
/// re-parked a held row at its own, older seq after the fallback, and claim_parked handed out
/// every non-failed row of a key whose head was not failed. The checker finds the review's
/// scenario: M1 fails and is parked at a fresh seq, a checkpoint passes M1 but not M2, M2 is
/// parked behind M1 by CDC and again, ahead of it, by polling, and goes out while M1 is failed.
#[test]
fn parking_at_fresh_seqs_lets_a_key_overtake_its_failed_message_after_the_fallback() {
    let cfg = Config {
        bugs: Bugs {
            fallback_reparks: true,
            parked_past_failed: true,
            ..Bugs::default()
        },
        ..Config::cdc_fallback()
    };
    let path = find("fallback re-parks (e1632a8)", cfg, NO_OVERTAKING);
    let actions = path.into_actions();
    assert!(actions.contains(&Action::Fallback));
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::ClaimParked { .. })));
}

/// claim_parked.sql's fix alone (rows only below a key's first failed one) does not fix N2:
/// the copy polling parks at the row's own seq sorts ahead of the failed message, so nothing in
/// the table says it is behind it. What fixes it is parking at the row's own seq and skipping a
/// message parked already (the checker finds the same overtaking without that).
#[test]
fn the_fallback_defect_is_not_fixed_by_claim_parked_alone() {
    let cfg = Config {
        bugs: Bugs {
            fallback_reparks: true,
            ..Bugs::default()
        },
        ..Config::cdc_fallback()
    };
    find("fallback re-parks, claim_parked fixed", cfg, NO_OVERTAKING);
    // And with no checkpoint between, polling re-parks the failed message itself ahead of its
    // failed copy: it goes out without a redrive.
    let cfg = Config {
        bugs: Bugs {
            fallback_reparks: true,
            ..Bugs::default()
        },
        ..Config::cdc_fallback()
    };
    find("fallback re-parks, claim_parked fixed", cfg, FAILED_HELD);
}

/// claim_parked.sql's old rule (every non-failed row of a key whose head is not failed) loses
/// nothing and keeps every key in order once parking keeps seqs: the relay parks a key in seq
/// order, so a failed message is its key's head. The fix is defence in depth, for layouts the
/// relay does not write (a lock-less writer, a hand repair); its SQL test plants one.
#[test]
fn handing_out_past_a_failed_row_needs_a_layout_the_relay_never_writes() {
    for (name, base) in [
        ("parking", Config::parking()),
        ("cdc fallback", Config::cdc_fallback()),
    ] {
        let cfg = Config {
            bugs: Bugs {
                parked_past_failed: true,
                ..Bugs::default()
            },
            ..base
        };
        check_whole(name, cfg);
    }
}

/// The engine review's N4: compare-and-append refused a record only while the position it read
/// had a successor. Pruning removes both (superseded, older than a minute); a record abandoned
/// before then lands as the newest position, with the window its claim read.
#[test]
fn pruning_frees_a_successor_slot_and_a_late_record_moves_the_position_back() {
    let cfg = Config {
        bugs: Bugs {
            prune_frees_successor: true,
            ..Bugs::default()
        },
        ..Config::pruning()
    };
    let path = find("prune frees the successor slot", cfg, NEVER_BACKWARDS);
    let actions = path.into_actions();
    assert!(actions.contains(&Action::Prune));
    assert!(actions.iter().any(|a| matches!(a, Action::Abandon { .. })));
}
