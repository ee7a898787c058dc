//! Model checks of the relay's window/position protocol: the fixed protocol keeps every
//! property over the whole state space of each configuration, and each planted bug is found.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Instant;

use outbox_model::properties::{NEVER_BACKWARDS, NO_LOSS};
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
