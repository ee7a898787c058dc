//! PostgreSQL snapshots reduced to what the protocol reads: `xmax`, the `xip` list, visibility
//! and the order in which snapshots are taken.

use std::fmt;

/// A transaction id (`xid8` in PostgreSQL). Small: a model hands out at most [`MAX_XID`].
pub type Xid = u8;

/// A value drawn from the outbox's `seq` sequence (0: nothing drawn yet).
pub type Seq = u8;

/// The highest transaction id a model may assign: `xip` is a 32-bit set.
pub const MAX_XID: Xid = 31;

/// A snapshot as PostgreSQL takes it: `xmax` is `latestCompletedXid + 1`, `xip` the ids below
/// `xmax` still running at that instant. Ids at or above `xmax` are invisible whatever their
/// fate, which is why a running transaction above `xmax` needs no `xip` entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Snapshot {
    xmax: Xid,
    /// Bit `t` set: transaction `t` was running when the snapshot was taken.
    xip: u32,
}

impl Snapshot {
    /// The snapshot taken when `latest_completed` is the highest completed id and `running`
    /// the ids assigned and not completed (those at or above the new `xmax` are left out, as
    /// PostgreSQL leaves them out).
    pub fn take(latest_completed: Xid, running: impl IntoIterator<Item = Xid>) -> Self {
        let xmax = latest_completed + 1;
        let xip = running
            .into_iter()
            .filter(|&t| t < xmax)
            .fold(0u32, |set, t| set | (1 << t));
        Self { xmax, xip }
    }

    /// `pg_snapshot_xmax`: the first id this snapshot treats as not yet completed.
    pub fn xmax(&self) -> Xid {
        self.xmax
    }

    /// `pg_snapshot_xmin`: the oldest id still running when the snapshot was taken (or `xmax`
    /// when none was). Every id below it had completed.
    pub fn xmin(&self) -> Xid {
        if self.xip == 0 {
            self.xmax
        } else {
            // The lowest set bit is at most 31, so the cast cannot truncate.
            self.xip.trailing_zeros() as Xid
        }
    }

    /// Whether `xid` is in the `xip` list (running when the snapshot was taken, below `xmax`).
    pub fn in_progress(&self, xid: Xid) -> bool {
        xid <= MAX_XID && self.xip & (1 << xid) != 0
    }

    /// Whether `xid` had completed (committed or rolled back) when the snapshot was taken:
    /// `pg_visible_in_snapshot` is this and "committed".
    pub fn completed(&self, xid: Xid) -> bool {
        xid < self.xmax && !self.in_progress(xid)
    }

    /// Whether every transaction completed in `self` is completed in `later` too: true of any
    /// snapshot taken after `self`, which is what a position moving forward means.
    pub fn precedes(&self, later: &Snapshot) -> bool {
        // Below self's xmax, `later` may only have fewer running ids; at or above it anything
        // goes (those ids were invisible to self anyway).
        let below = if self.xmax > MAX_XID {
            u32::MAX
        } else {
            (1u32 << self.xmax) - 1
        };
        self.xmax <= later.xmax && later.xip & below & !self.xip == 0
    }
}

impl fmt::Debug for Snapshot {
    /// PostgreSQL's text form, `xmin:xmax:xip,…`, so paths read like `pg_current_snapshot()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:", self.xmin(), self.xmax)?;
        let mut first = true;
        for t in 0..=MAX_XID {
            if self.in_progress(t) {
                if !first {
                    write!(f, ",")?;
                }
                write!(f, "{t}")?;
                first = false;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_id_above_xmax_is_not_in_xip_and_not_completed() {
        // 5 completed last; 3 still runs; 6 runs too but got its id after 5 completed.
        let s = Snapshot::take(5, [3, 6]);
        assert_eq!(format!("{s:?}"), "3:6:3");
        assert!(!s.completed(3));
        assert!(s.completed(4));
        assert!(!s.completed(6));
        assert_eq!(s.xmin(), 3);
    }

    #[test]
    fn a_later_snapshot_follows_an_earlier_one() {
        let early = Snapshot::take(5, [3, 4]);
        let later = Snapshot::take(7, [4]);
        assert!(early.precedes(&later));
        assert!(!later.precedes(&early));
        // Same xmax but a new id in xip below it cannot come later.
        assert!(!Snapshot::take(5, [4]).precedes(&Snapshot::take(5, [3, 4])));
    }
}
