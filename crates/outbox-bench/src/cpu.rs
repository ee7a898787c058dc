//! CPU time read from `/proc`, per process group, around a measured stretch: this process (the
//! relay under test, and the bench's own read-back consumer), the database server (every
//! `postgres` process, or MariaDB's `mariadbd`), and the broker (its server processes by name). A drain divides each by the
//! messages it moved: the CPU one message costs each of them, which on a machine whose cores
//! they all share sets the pace (`1 / (1/client + 1/engine)`, see docs/performance.md).

use std::collections::HashMap;

use serde::Serialize;

/// Clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`, 100 on every Linux target).
pub const USER_HZ: f64 = 100.0;

/// Process names (`comm`) of the brokers the bench drains into.
const BROKERS: &[&str] = &[
    "nats-server",
    "redis-server",
    "beam.smp",
    "mosquitto",
    "tansu",
    "moto_server",
];

/// CPU ticks of each group at one instant.
#[derive(Debug, Clone)]
pub struct CpuMeter {
    own: u64,
    database: &'static [&'static str],
    postgres: HashMap<u32, u64>,
    broker: HashMap<u32, u64>,
}

/// CPU each message cost, in microseconds, per group.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct CpuPerMessage {
    /// This process: the relay and the bench's read-back consumer.
    pub relay_us: f64,
    /// Every PostgreSQL process (other sessions on the server included); the MariaDB server
    /// when the meter was started for it ([`CpuMeter::start_with`]).
    pub postgres_us: f64,
    /// The broker's server processes.
    pub broker_us: f64,
}

impl CpuPerMessage {
    /// `relay 12.3 µs, PostgreSQL 8.1 µs, broker 9.0 µs per message`.
    pub fn line(&self) -> String {
        self.line_as("PostgreSQL")
    }

    /// [`CpuPerMessage::line`] with the database server named `server` (`MariaDB`).
    pub fn line_as(&self, server: &str) -> String {
        format!(
            "CPU per message: relay {:.1} µs, {server} {:.1} µs, broker {:.1} µs",
            self.relay_us, self.postgres_us, self.broker_us
        )
    }
}

impl CpuMeter {
    /// The counters now, PostgreSQL's processes as the database.
    pub fn start() -> Self {
        Self::start_with(&["postgres"])
    }

    /// The counters now, the processes named `database` as the database server.
    pub fn start_with(database: &'static [&'static str]) -> Self {
        Self {
            own: own_ticks().unwrap_or(0),
            database,
            postgres: ticks_of(database),
            broker: ticks_of(BROKERS),
        }
    }

    /// What each group used since `self`, divided by `messages`.
    pub fn per_message(&self, messages: u64) -> Option<CpuPerMessage> {
        if messages == 0 {
            return None;
        }
        let now = Self::start_with(self.database);
        let us = |ticks: u64| ticks as f64 / USER_HZ * 1e6 / messages as f64;
        Some(CpuPerMessage {
            relay_us: us(now.own.saturating_sub(self.own)),
            postgres_us: us(used(&self.postgres, &now.postgres)),
            broker_us: us(used(&self.broker, &now.broker)),
        })
    }
}

/// CPU over a stretch of wall time, as percentages of one core: this process, and PostgreSQL's
/// processes (all, or some by pid).
pub struct CpuWindow {
    own: u64,
    relay: u64,
    postgres: HashMap<u32, u64>,
    started: std::time::Instant,
}

/// What a [`CpuWindow`] read at its end.
pub struct CpuUsed {
    /// Wall time of the window.
    pub seconds: f64,
    own: u64,
    relay: u64,
    before: HashMap<u32, u64>,
    after: HashMap<u32, u64>,
}

impl CpuWindow {
    /// Starts the window now.
    pub fn start() -> anyhow::Result<Self> {
        Ok(Self {
            own: own_ticks()?,
            relay: thread_ticks(crate::relay::THREAD_NAME),
            postgres: ticks_of(&["postgres"]),
            started: std::time::Instant::now(),
        })
    }

    /// Ends the window now.
    pub fn end(self) -> anyhow::Result<CpuUsed> {
        let own = own_ticks()?.saturating_sub(self.own);
        let relay = thread_ticks(crate::relay::THREAD_NAME).saturating_sub(self.relay);
        Ok(CpuUsed {
            after: ticks_of(&["postgres"]),
            seconds: self.started.elapsed().as_secs_f64(),
            own,
            relay,
            before: self.postgres,
        })
    }
}

impl CpuUsed {
    fn percent(&self, ticks: u64) -> f64 {
        ticks as f64 / USER_HZ / self.seconds * 100.0
    }

    /// This process, % of one core.
    pub fn own_percent(&self) -> f64 {
        self.percent(self.own)
    }

    /// The relay under test's own threads (its runtime), % of one core.
    pub fn relay_percent(&self) -> f64 {
        self.percent(self.relay)
    }

    /// Every PostgreSQL process, % of one core.
    pub fn postgres_percent(&self) -> f64 {
        self.percent(used(&self.before, &self.after))
    }

    /// The PostgreSQL processes `pids`, % of one core.
    pub fn postgres_percent_of(&self, pids: &[u32]) -> f64 {
        let ticks = pids
            .iter()
            .map(|pid| {
                let after = self.after.get(pid).copied().unwrap_or(0);
                after.saturating_sub(self.before.get(pid).copied().unwrap_or(0))
            })
            .sum();
        self.percent(ticks)
    }
}

/// Ticks used between two readings: a process that started in between counts from zero; one
/// that exited in between is lost.
fn used(before: &HashMap<u32, u64>, after: &HashMap<u32, u64>) -> u64 {
    after
        .iter()
        .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or(0)))
        .sum()
}

/// utime + stime of this process, in clock ticks.
pub fn own_ticks() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    parse_stat(&stat)
        .map(|(_, ticks)| ticks)
        .ok_or_else(|| anyhow::anyhow!("/proc/self/stat has an unexpected format"))
}

/// utime + stime of this process's threads named `name` (`comm`), in clock ticks: the relay
/// under test runs on a runtime of its own whose threads carry one name (see
/// [`crate::relay::THREAD_NAME`]), so its CPU is told from the producers' and the read-back
/// consumer's. A thread that exited is lost.
pub fn thread_ticks(name: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (comm, ticks) = parse_stat(&stat)?;
            (comm == name).then_some(ticks)
        })
        .sum()
}

/// utime + stime of process `pid`, in clock ticks (`None` once it is gone).
pub fn pid_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, ticks)| ticks)
}

/// utime + stime of every process whose `comm` is one of `names`, by pid, in clock ticks.
pub fn ticks_of(names: &[&str]) -> HashMap<u32, u64> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            // A process may exit between listing and reading: skip it.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (comm, ticks) = parse_stat(&stat)?;
            names.contains(&comm).then_some((pid, ticks))
        })
        .collect()
}

/// `(comm, utime + stime)` from the text of `/proc/<pid>/stat`. `comm` is in parentheses and
/// may hold spaces, so fields are counted from the last `)`: utime and stime are fields 14
/// and 15 of the line, the 12th and 13th after it.
pub fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let mut rest = stat.get(close + 1..)?.split_whitespace().skip(11);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "2212 (postgres) S 2211 2211 2211 0 -1 4194368 3010 0 0 0 17 42 0 0 20 0 1 0 \
                    1234 226881536 5000 18446744073709551615 0 0 0 0 0 0 0 4096 16385 0 0 0 17 1 0 0";
        assert_eq!(parse_stat(line), Some(("postgres", 59)));
        let odd = "7 (a b) c) R 1 1 1 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1";
        assert_eq!(parse_stat(odd), Some(("a b) c", 7)));
    }

    #[test]
    fn this_process_has_a_readable_stat_and_a_meter_divides_by_messages() {
        assert!(own_ticks().is_ok());
        let m = CpuMeter::start();
        assert_eq!(m.per_message(0), None);
        assert!(m.per_message(1).is_some_and(|c| c.relay_us >= 0.0));
    }
}
