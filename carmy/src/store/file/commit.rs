//! Group commit for the records' table: the writes that arrive while one transaction is being
//! made durable share the next transaction, and so its fsync. Calls that come together cost
//! one fsync instead of one each, which is what bounds a durable store on one disk.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use redb::Database;
use tokio::sync::oneshot;

use super::failed;
use super::keys::{RECORDS, Table};
use crate::store::StoreError;

/// The most writes one transaction takes: the rest wait for the next.
const MAX_BATCH: usize = 1024;

/// One caller's write, run inside a transaction shared with others. It can run again: a batch
/// that fails is rolled back and each write is retried alone, so one write's failure is never
/// another's, and nothing of a failed write is ever committed.
trait Job: Send {
    fn run(&mut self, table: &mut Table<'_>) -> Result<(), StoreError>;
    /// The transaction ended: committed (`Ok`), or not, with why.
    fn done(self: Box<Self>, committed: Result<(), StoreError>);
}

struct Write<T, W> {
    work: W,
    result: Option<T>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, W> Job for Write<T, W>
where
    T: Send,
    W: FnMut(&mut Table<'_>) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, table: &mut Table<'_>) -> Result<(), StoreError> {
        self.result = Some((self.work)(table)?);
        Ok(())
    }

    fn done(self: Box<Self>, committed: Result<(), StoreError>) {
        let Write { result, reply, .. } = *self;
        let answer = committed.map(|()| result.expect("a committed write has run"));
        // The caller may have gone away: the write stands all the same.
        let _ = reply.send(answer);
    }
}

/// The thread that commits the records' writes, in batches.
pub(super) struct Committer {
    jobs: Option<Sender<Box<dyn Job>>>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    pub(super) fn start(database: Arc<Database>) -> std::io::Result<Self> {
        let (jobs, queue) = channel();
        let thread = std::thread::Builder::new()
            .name("carmy-file-commit".to_owned())
            .spawn(move || commit_forever(&database, &queue))?;
        Ok(Committer {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Runs `work` on the records' table in a durable transaction, maybe shared with other
    /// writes; `work` may run more than once, and its last run is the one committed.
    pub(super) async fn write<T: Send + 'static>(
        &self,
        work: impl FnMut(&mut Table<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Write {
            work,
            result: None,
            reply,
        });
        let stopped = || StoreError::message("the store file's committer has stopped");
        self.jobs
            .as_ref()
            .ok_or_else(stopped)?
            .send(job)
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

impl Drop for Committer {
    /// Waits for the writes already queued, so the file is closed when the store is dropped
    /// and can be opened again at once.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn commit_forever(database: &Database, queue: &Receiver<Box<dyn Job>>) {
    // Ends when the store is dropped and the queue is empty.
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH
            && let Ok(job) = queue.try_recv()
        {
            batch.push(job);
        }
        if batch.len() > 1 && commit(database, &mut batch).is_ok() {
            for job in batch {
                job.done(Ok(()));
            }
            continue;
        }
        for mut job in batch {
            let committed = commit(database, std::slice::from_mut(&mut job));
            job.done(committed);
        }
    }
}

/// Runs `jobs` in one durable write transaction; nothing is committed if any fails.
fn commit(database: &Database, jobs: &mut [Box<dyn Job>]) -> Result<(), StoreError> {
    let transaction = database.begin_write().map_err(failed)?;
    {
        let mut table = transaction.open_table(RECORDS).map_err(failed)?;
        for job in jobs.iter_mut() {
            job.run(&mut table)?;
        }
    }
    transaction.commit().map_err(failed)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    use redb::ReadableDatabase;

    use super::*;

    /// A store file in the system's temporary directory, deleted when dropped.
    struct TempFile(std::path::PathBuf);

    impl TempFile {
        fn new(name: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "carmy-commit-{name}-{}-{}.redb",
                std::process::id(),
                uuid::Uuid::now_v7()
            ));
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn open(file: &TempFile) -> Arc<Database> {
        let database = Database::create(&file.0).unwrap();
        let transaction = database.begin_write().unwrap();
        transaction.open_table(RECORDS).unwrap();
        transaction.commit().unwrap();
        Arc::new(database)
    }

    fn stored(database: &Database, request_id: &str) -> Option<Vec<u8>> {
        let transaction = database.begin_read().unwrap();
        let table = transaction.open_table(RECORDS).unwrap();
        let value = table.get(("caller", request_id)).unwrap();
        value.map(|value| value.value().to_vec())
    }

    /// Holds the committer in its first transaction until released, so that the writes sent
    /// meanwhile are queued and committed together.
    fn hold(committer: &Committer) -> (mpsc::Sender<()>, mpsc::Receiver<()>) {
        let (release, held) = mpsc::channel::<()>();
        let (entered, inside) = mpsc::channel::<()>();
        let held = std::sync::Mutex::new(held);
        let entered = std::sync::Mutex::new(entered);
        let job = Box::new(Write {
            work: move |_: &mut Table<'_>| {
                let _ = entered.lock().unwrap().send(());
                let _ = held.lock().unwrap().recv();
                Ok(())
            },
            result: None,
            reply: oneshot::channel().0,
        });
        committer.jobs.as_ref().unwrap().send(job).unwrap();
        (release, inside)
    }

    /// A committer on a new file, held in its first transaction; the sender releases it.
    fn held(name: &str) -> (TempFile, Arc<Database>, Arc<Committer>, mpsc::Sender<()>) {
        let file = TempFile::new(name);
        let database = open(&file);
        let committer = Arc::new(Committer::start(Arc::clone(&database)).unwrap());
        let (release, inside) = hold(&committer);
        inside.recv().unwrap();
        (file, database, committer, release)
    }

    /// Writes `value` under request id `r{number}`.
    fn put(table: &mut Table<'_>, number: usize, value: &[u8]) -> Result<(), StoreError> {
        let request_id = format!("r{number}");
        table
            .insert(("caller", request_id.as_str()), value)
            .map_err(failed)?;
        Ok(())
    }

    #[tokio::test]
    async fn concurrent_writes_share_a_transaction_and_a_failing_one_fails_alone() {
        let (_file, database, committer, release) = held("batch");
        let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..50).map(|_| AtomicUsize::new(0)).collect());
        let mut writes = Vec::new();
        for number in 0..50 {
            let (committer, runs) = (Arc::clone(&committer), Arc::clone(&runs));
            writes.push(tokio::spawn(async move {
                committer
                    .write(move |table| {
                        runs[number].fetch_add(1, Ordering::SeqCst);
                        put(table, number, b"written")?;
                        // Fails after writing: what it wrote must not be committed.
                        if number == 20 {
                            return Err(StoreError::message("this write fails"));
                        }
                        Ok(number)
                    })
                    .await
            }));
        }
        // On this single-threaded runtime, every write is queued before this task runs again.
        tokio::task::yield_now().await;
        release.send(()).unwrap();
        for (number, write) in writes.into_iter().enumerate() {
            let answer = write.await.unwrap();
            if number == 20 {
                assert!(
                    answer
                        .unwrap_err()
                        .to_string()
                        .ends_with("this write fails")
                );
                assert_eq!(stored(&database, "r20"), None);
            } else {
                assert_eq!(answer.unwrap(), number);
                assert_eq!(
                    stored(&database, &format!("r{number}")).unwrap(),
                    b"written"
                );
            }
        }
        // The 50 shared one transaction, which stopped at the failing write and was rolled
        // back; then each ran again alone.
        for (number, count) in runs.iter().enumerate() {
            let expected = if number <= 20 { 2 } else { 1 };
            assert_eq!(count.load(Ordering::SeqCst), expected, "write {number}");
        }
    }

    #[tokio::test]
    async fn a_batch_that_succeeds_runs_each_write_once() {
        let (_file, database, committer, release) = held("once");
        let runs = Arc::new(AtomicUsize::new(0));
        let mut writes = Vec::new();
        for number in 0..20 {
            let (committer, runs) = (Arc::clone(&committer), Arc::clone(&runs));
            writes.push(tokio::spawn(async move {
                committer
                    .write(move |table| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        put(table, number, b"w")
                    })
                    .await
            }));
        }
        tokio::task::yield_now().await;
        release.send(()).unwrap();
        for write in writes {
            write.await.unwrap().unwrap();
        }
        assert_eq!(runs.load(Ordering::SeqCst), 20);
        for number in 0..20 {
            assert!(stored(&database, &format!("r{number}")).is_some());
        }
    }

    #[tokio::test]
    async fn dropping_the_committer_closes_the_file() {
        let file = TempFile::new("close");
        let database = open(&file);
        let committer = Committer::start(Arc::clone(&database)).unwrap();
        committer
            .write(|table| {
                table.insert(("caller", "r"), &b"w"[..]).map_err(failed)?;
                Ok(())
            })
            .await
            .unwrap();
        drop(committer);
        drop(database);
        let reopened = Database::create(&file.0).expect("no one holds the file");
        assert_eq!(stored(&reopened, "r").unwrap(), b"w");
    }
}
