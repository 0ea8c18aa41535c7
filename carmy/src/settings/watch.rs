//! What triggers a reload by itself: SIGHUP, and a change in the file's directory. The
//! directory, not the file, is watched: editors save by writing a new file and renaming it
//! over the old one, and a Kubernetes ConfigMap swaps its `..data` symlink, so a watch on the
//! file itself would stay on the replaced inode.

use std::ffi::OsString;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use notify::{PollWatcher, RecursiveMode};
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer_opt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::reload::{Reloader, Trigger};

/// Events closer together than this are one change: a save is several writes and a rename.
const DEBOUNCE: Duration = Duration::from_millis(250);
/// How often the directory is scanned where file events are unavailable (some network and
/// container file systems): a change still applies within seconds.
const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Starts the SIGHUP listener and the directory watcher of `source`.
pub(super) fn spawn(reloader: Weak<Reloader>, source: &Path) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    #[cfg(unix)]
    tasks.extend(on_hangup(Weak::clone(&reloader)));
    tasks.extend(on_change(reloader, source));
    tasks
}

#[cfg(unix)]
fn on_hangup(reloader: Weak<Reloader>) -> Option<JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = signal(SignalKind::hangup())
        .inspect_err(|error| tracing::warn!(%error, "configuration reload not listening to SIGHUP"))
        .ok()?;
    Some(tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let Some(reloader) = reloader.upgrade() else {
                return;
            };
            // The outcome is logged, counted and shown in health by the reloader.
            let _ = reloader.reload(Trigger::Signal);
        }
    }))
}

/// Watches the directory of `source` with the platform's file events (inotify on Linux), or
/// by polling where they are unavailable.
fn on_change(reloader: Weak<Reloader>, source: &Path) -> Option<JoinHandle<()>> {
    let directory = match source.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = source.file_name()?.to_owned();
    let changed = Arc::new(Notify::new());
    let handler = {
        let changed = Arc::clone(&changed);
        move |events: DebounceEventResult| match events {
            Ok(events) => {
                if events
                    .iter()
                    .any(|event| concerns(event.path.file_name(), &name))
                {
                    changed.notify_one();
                }
            }
            Err(error) => tracing::warn!(%error, "watching the configuration file"),
        }
    };
    let watcher = watch::<notify::RecommendedWatcher>(directory, handler.clone())
        .map(|watcher| Box::new(watcher) as Box<dyn Send>)
        .or_else(|error| {
            tracing::info!(%error, "no file events for the configuration file: polling it");
            watch::<PollWatcher>(directory, handler).map(|watcher| Box::new(watcher) as _)
        })
        .inspect_err(|error| {
            tracing::warn!(%error, directory = %directory.display(), "configuration file not watched");
        })
        .ok()?;
    let source = source.to_owned();
    Some(tokio::spawn(async move {
        // Dropping the debouncer (when this task ends) stops the watch.
        let _watcher = watcher;
        let mut last = None;
        loop {
            changed.notified().await;
            // inotify reports the reload's own open and read of the file as events on it: a
            // file whose stamp has not changed since the last reload is not read again, or
            // every reload would cause the next.
            let now = Stamp::of(&source);
            if now.is_some() && now == last {
                continue;
            }
            last = now;
            let Some(reloader) = reloader.upgrade() else {
                return;
            };
            let _ = reloader.reload(Trigger::File);
        }
    }))
}

/// What identifies a version of the file without opening it: where it lives (a rename or a
/// symlink swap changes it), its size, and when it and its metadata last changed.
#[derive(Debug, PartialEq, Eq)]
struct Stamp {
    #[cfg(unix)]
    device_and_inode: (u64, u64),
    #[cfg(unix)]
    changed: (i64, i64),
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Stamp {
    /// `None` when the file cannot be looked at: a reload then says why.
    fn of(path: &Path) -> Option<Self> {
        let metadata = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt as _;
        Some(Stamp {
            #[cfg(unix)]
            device_and_inode: (metadata.dev(), metadata.ino()),
            #[cfg(unix)]
            changed: (metadata.ctime(), metadata.ctime_nsec()),
            len: metadata.len(),
            modified: metadata.modified().ok(),
        })
    }
}

fn watch<W: notify::Watcher>(
    directory: &Path,
    handler: impl Fn(DebounceEventResult) + Send + 'static,
) -> Result<Debouncer<W>, notify::Error> {
    let config = notify_debouncer_mini::Config::default()
        .with_timeout(DEBOUNCE)
        .with_notify_config(notify::Config::default().with_poll_interval(POLL_INTERVAL));
    let mut debouncer = new_debouncer_opt::<_, W>(config, handler)?;
    debouncer
        .watcher()
        .watch(directory, RecursiveMode::NonRecursive)?;
    Ok(debouncer)
}

/// Whether a change to the entry `changed` of the directory may change the file `name`: the
/// file itself, or a Kubernetes ConfigMap's `..data` / `..2026_…` entries it links through.
fn concerns(changed: Option<&std::ffi::OsStr>, name: &OsString) -> bool {
    changed.is_some_and(|changed| {
        changed == name.as_os_str() || changed.as_encoded_bytes().starts_with(b"..")
    })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// The fallback where file events are unavailable: the polling watcher sees a file
    /// renamed over the configuration, as an editor saves it.
    #[test]
    fn the_polling_fallback_sees_a_rename_over_the_file() {
        let directory = std::env::temp_dir().join(format!("carmy-poll-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let file = directory.join("carmy.toml");
        std::fs::write(&file, "security_headers = false\n").unwrap();
        let name = OsString::from("carmy.toml");
        let (sender, changes) = mpsc::channel();
        let handler = move |events: DebounceEventResult| {
            let concerned = events
                .unwrap()
                .iter()
                .any(|event| concerns(event.path.file_name(), &name));
            if concerned {
                let _ = sender.send(());
            }
        };
        let _watcher = watch::<PollWatcher>(&directory, handler).unwrap();
        // Let the first scan record the directory as it is, then save a new version.
        std::thread::sleep(POLL_INTERVAL + DEBOUNCE);
        let saved = directory.join(".carmy.toml.swp");
        std::fs::write(&saved, "security_headers = true\n").unwrap();
        std::fs::rename(&saved, &file).unwrap();
        let seen = changes.recv_timeout(POLL_INTERVAL * 5);
        std::fs::remove_dir_all(&directory).unwrap();
        assert!(seen.is_ok(), "the polling watcher saw no change");
    }

    #[test]
    fn only_the_file_and_configmap_entries_concern_it() {
        let name = OsString::from("carmy.toml");
        assert!(concerns(Some("carmy.toml".as_ref()), &name));
        assert!(concerns(Some("..data".as_ref()), &name));
        assert!(concerns(Some("..2026_12_01_07_00_00.123".as_ref()), &name));
        assert!(!concerns(Some("other.toml".as_ref()), &name));
        assert!(!concerns(Some(".carmy.toml.swp".as_ref()), &name));
        assert!(!concerns(None, &name));
    }
}
