//! The two runtimes of a server. The API, the UI, the database and every background task
//! run on the runtime that starts the server (`levee serve`'s); agent sync — the gRPC
//! streams (sync and xDS), the fan-out of each new revision to them, and the decoding of
//! what agents send back — runs on a runtime of its own ([`SyncRuntime`]), on its own
//! threads.
//!
//! Why: a flip wakes every stream of the service at once. On one shared runtime the
//! operator's request, woken by its own database read, queued behind those 10,000 session
//! tasks and their writes, and its answer took seconds (docs/benchmarks.md, "Control
//! plane"). On separate threads the kernel shares the cores between the two, so the API
//! answers in its own time however busy the streams are; the write only wakes the streams
//! (publishing to the hub), it never waits for them.

use std::future::Future;

use tokio::runtime::{Builder, Handle, Runtime};

/// Most threads `sync_threads` may ask for.
pub const MAX_SYNC_THREADS: usize = 256;

/// Default threads of the sync runtime: one per CPU the process may use, as the main
/// runtime has. The kernel shares the CPUs between the two runtimes' threads.
pub fn default_sync_threads() -> usize {
    std::thread::available_parallelism().map(std::num::NonZeroUsize::get).unwrap_or(2)
}

/// The dedicated runtime of agent sync. Dropping it stops what still runs on it without
/// waiting (the server's shutdown has ended the streams by then).
#[derive(Debug)]
pub struct SyncRuntime {
    rt: Option<Runtime>,
}

impl SyncRuntime {
    /// A multi-thread runtime with `threads` workers named `levee-sync`.
    ///
    /// # Errors
    /// The threads cannot be started.
    pub fn new(threads: usize) -> std::io::Result<SyncRuntime> {
        let rt = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("levee-sync")
            .enable_all()
            .build()?;
        Ok(SyncRuntime { rt: Some(rt) })
    }

    /// A handle to spawn on it (tests block its workers with one to show the API does not
    /// depend on them).
    pub fn handle(&self) -> &Handle {
        self.rt.as_ref().expect("present until dropped").handle()
    }
}

impl Drop for SyncRuntime {
    fn drop(&mut self) {
        // A runtime dropped inside another one's task must not block: shut down in the
        // background.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Where the sync side's database reads run: on the server's main runtime, never on the
/// sync runtime. A PostgreSQL connection is driven by the runtime it was opened on and
/// the pool hands it to any caller later, so a connection opened by a stream would make
/// the API's queries wait for a runtime busy with the fan-out. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DbRuntime(Handle);

impl DbRuntime {
    /// The runtime this is called on.
    pub fn current() -> DbRuntime {
        DbRuntime(Handle::current())
    }

    /// Runs `fut` there (started at once) and hands back its output; `None` when that runtime is shutting down (a
    /// panic in `fut` goes on in the caller).
    pub fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> impl Future<Output = Option<T>> + Send + 'static {
        let task = self.0.spawn(fut);
        async move {
            match task.await {
                Ok(v) => Some(v),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => None,
            }
        }
    }
}
