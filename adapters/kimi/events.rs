//! Where coda-kimi's watch learns that something may have changed: an [`EventSource`].
//!
//! In the binary that is
//! `notify`'s recommended watcher (inotify on Linux, FSEvents on macOS), one non-recursive watch per folder; in
//! tests a scripted source. Whatever an event says, it only wakes the watch, which then looks at every file.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use notify::Watcher;

/// Why the watch woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Something in a watched folder may have changed.
    Changed,
    /// Nothing came within the time asked for.
    Quiet,
    /// The watch is to end.
    Stop,
}

/// Where the watch learns that something may have changed: `notify` (inotify, FSEvents, ...) in the binary, a
/// scripted source in tests.
pub trait EventSource: Send {
    /// From now on, reports changes of the entries directly inside `folder` (not below it).
    fn watch(&mut self, folder: &Path) -> Result<(), String>;
    /// Blocks until something may have changed, `timeout` passed or the watch is to end.
    fn wait(&mut self, timeout: Duration) -> Wake;
    /// Without waiting: whether something may have changed since the last [`EventSource::wait`] (a request to
    /// end the watch seen here is left to the watch's stop flag, which is set before it is sent).
    fn more(&mut self) -> bool {
        false
    }
}

/// The real event source: `notify`'s recommended watcher (inotify on Linux, FSEvents on macOS), one
/// non-recursive watch per folder.
pub struct NotifySource {
    pub watcher: notify::RecommendedWatcher,
    pub rx: mpsc::Receiver<Msg>,
}

pub enum Msg {
    Fs(notify::Result<notify::Event>),
    Stop,
}

/// Our own reads raise open and close events on inotify: they must not wake a scan, or the watch would feed
/// itself. Anything else (a write, a rename, a folder-only event, a "rescan" or an error) may be a change.
fn may_be_a_change(msg: &notify::Result<notify::Event>) -> bool {
    use notify::EventKind::Access;
    use notify::event::{AccessKind, AccessMode};
    match msg {
        Ok(ev) => !matches!(
            ev.kind,
            Access(AccessKind::Open(_) | AccessKind::Read | AccessKind::Close(AccessMode::Read | AccessMode::Execute))
        ),
        Err(_) => true,
    }
}

impl EventSource for NotifySource {
    fn watch(&mut self, folder: &Path) -> Result<(), String> {
        self.watcher.watch(folder, notify::RecursiveMode::NonRecursive).map_err(|e| e.to_string())
    }

    /// Events that are no change (our own reads) do not end the wait: the look after it would raise more.
    fn wait(&mut self, timeout: Duration) -> Wake {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let first = match self.rx.recv_timeout(left) {
                Ok(m) => m,
                Err(mpsc::RecvTimeoutError::Timeout) => return Wake::Quiet,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Wake::Stop,
            };
            let mut changed = false;
            for msg in std::iter::once(first).chain(std::iter::from_fn(|| self.rx.try_recv().ok())) {
                match msg {
                    Msg::Stop => return Wake::Stop,
                    Msg::Fs(ev) => {
                        tracing::trace!("file event {:?}", ev.as_ref().map(|e| e.kind));
                        changed |= may_be_a_change(&ev);
                    }
                }
            }
            if changed {
                return Wake::Changed;
            }
        }
    }

    fn more(&mut self) -> bool {
        let mut changed = false;
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                Msg::Stop => return false,
                Msg::Fs(ev) => changed |= may_be_a_change(&ev),
            }
        }
        changed
    }
}

/// No watcher could be made: only the periodic look, and the stop.
pub struct Unwatched {
    pub rx: mpsc::Receiver<Msg>,
}

impl EventSource for Unwatched {
    fn watch(&mut self, _folder: &Path) -> Result<(), String> {
        Err("no watcher".into())
    }

    fn wait(&mut self, timeout: Duration) -> Wake {
        match self.rx.recv_timeout(timeout) {
            Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => Wake::Stop,
            Ok(Msg::Fs(_)) | Err(mpsc::RecvTimeoutError::Timeout) => Wake::Quiet,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, Flag, ModifyKind, RenameMode};
    use notify::{Event, EventKind};

    #[test]
    fn only_our_own_reads_are_no_change() {
        let no = [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
        ];
        for kind in no {
            assert!(!may_be_a_change(&Ok(Event::new(kind))), "{kind:?}");
        }
        let yes = [
            // inotify: a write, Kimi's close after its write, an atomic replace; FSEvents: a folder-only or
            // unknown change, a rename of either end; either: lost events.
            Event::new(EventKind::Modify(ModifyKind::Data(DataChange::Any))),
            Event::new(EventKind::Access(AccessKind::Close(AccessMode::Write))),
            Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::To))),
            Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Any))),
            Event::new(EventKind::Create(CreateKind::File)),
            Event::new(EventKind::Any),
            Event::new(EventKind::Other).set_flag(Flag::Rescan),
        ];
        for ev in yes {
            assert!(may_be_a_change(&Ok(ev.clone())), "{ev:?}");
        }
        assert!(may_be_a_change(&Err(notify::Error::generic("queue overflow"))));
    }
}
