//! The contract of every `ExecutionStore` (`protocol.md` §9), written once against the trait
//! and run against each engine.

use std::sync::Arc;

use bytes::Bytes;
use carmy::store::{
    Cancellation, ExecutionQuery, ExecutionRecord, ExecutionState, ExecutionStore, MemoryStore,
    RecordedEvent, RecordedOutcome, StoredResponse,
};
use carmy::{Category, ExecutionStatus};
use carmy_tests::run_id;

use super::{LEASE, TTL, TempFile, file_store, postgres_store, redis_store, response};

/// Executions kept for their callers (protocol.md §9): begin, progress bounded to the latest
/// 100, cancellation, end, lookup scoped to the caller, and the list, newest first.
pub(crate) async fn executions_contract(store: &dyn ExecutionStore, name: &str) {
    let alice = format!("alice-{name}-{}", run_id());
    let bob = format!("bob-{name}-{}", run_id());
    let id = |n: u32| -> Arc<str> { Arc::from(format!("exec_{}-{name}-{n:03}", run_id())) };
    let (first, second, third, bobs) = (id(1), id(2), id(3), id(4));
    for (caller, execution) in [
        (&alice, &first),
        (&alice, &second),
        (&alice, &third),
        (&bob, &bobs),
    ] {
        let tool = if *execution == third {
            "report"
        } else {
            "create_order"
        };
        store
            .begin_execution(caller, execution, tool, LEASE)
            .await
            .unwrap();
    }
    let running = store.execution(&alice, &first).await.unwrap().unwrap();
    assert_eq!(&*running.tool, "create_order");
    assert_eq!(running.state(), ExecutionState::Running);
    assert!(running.outcome.is_none() && running.progress.is_empty() && !running.cancel_requested);
    assert_eq!(
        store.execution(&bob, &first).await.unwrap(),
        None,
        "another caller's"
    );
    assert_eq!(store.execution(&alice, "exec_missing").await.unwrap(), None);

    for event in 2..=151_u64 {
        let data = Bytes::from(format!("{{\"progress\":{event}}}"));
        store
            .record_progress(&first, RecordedEvent::new(event, data))
            .await
            .unwrap();
    }
    let ids = |record: &ExecutionRecord| -> Vec<u64> {
        record.progress.iter().map(|event| event.id).collect()
    };
    let record = store.execution(&alice, &first).await.unwrap().unwrap();
    assert_eq!(
        ids(&record),
        (52..=151).collect::<Vec<_>>(),
        "the latest 100 are kept"
    );
    assert_eq!(&record.progress[99].data[..], b"{\"progress\":151}");

    assert_eq!(
        store.cancel_execution(&bob, &first).await.unwrap(),
        Cancellation::NotFound
    );
    assert!(
        !store
            .execution(&alice, &first)
            .await
            .unwrap()
            .unwrap()
            .cancel_requested
    );
    assert_eq!(
        store.cancel_execution(&alice, &first).await.unwrap(),
        Cancellation::Requested
    );
    assert!(
        store
            .execution(&alice, &first)
            .await
            .unwrap()
            .unwrap()
            .cancel_requested
    );

    let cancelled = StoredResponse::new(
        Arc::clone(&first),
        ExecutionStatus::Cancelled,
        Some(Category::Cancelled),
        Some(Arc::from("CANCELLED")),
        Bytes::from_static(b"{\"status\":\"cancelled\"}"),
    );
    let ended = RecordedOutcome::new(cancelled, 152);
    store
        .end_execution(&first, ended.clone(), TTL)
        .await
        .unwrap();
    // Once ended, late progress and a second end change nothing.
    store
        .record_progress(&first, RecordedEvent::new(153, Bytes::from_static(b"{}")))
        .await
        .unwrap();
    let other_end = RecordedOutcome::new(response(&first), 200);
    store.end_execution(&first, other_end, TTL).await.unwrap();
    let record = store.execution(&alice, &first).await.unwrap().unwrap();
    assert_eq!(record.outcome, Some(ended));
    assert_eq!(
        record.state(),
        ExecutionState::Ended(ExecutionStatus::Cancelled)
    );
    assert_eq!(ids(&record).last(), Some(&151));
    assert_eq!(
        store.cancel_execution(&alice, &first).await.unwrap(),
        Cancellation::Ended
    );
    assert_eq!(
        store
            .cancel_execution(&alice, "exec_missing")
            .await
            .unwrap(),
        Cancellation::NotFound
    );

    let completed = RecordedOutcome::new(response(&second), 2);
    store.end_execution(&second, completed, TTL).await.unwrap();

    let list = |query: ExecutionQuery| {
        let alice = alice.clone();
        async move {
            store
                .executions(&alice, &query)
                .await
                .unwrap()
                .into_iter()
                .map(|summary| (summary.execution_id.to_string(), summary.state))
                .collect::<Vec<_>>()
        }
    };
    let all = ExecutionQuery::new(10);
    assert_eq!(
        list(all.clone()).await,
        [
            (third.to_string(), ExecutionState::Running),
            (
                second.to_string(),
                ExecutionState::Ended(ExecutionStatus::Completed)
            ),
            (
                first.to_string(),
                ExecutionState::Ended(ExecutionStatus::Cancelled)
            ),
        ]
    );
    let mut page = all.clone();
    page.limit = 1;
    page.before = Some(third.to_string());
    assert_eq!(
        list(page).await,
        [(
            second.to_string(),
            ExecutionState::Ended(ExecutionStatus::Completed)
        )]
    );
    let mut running = all.clone();
    running.state = Some(ExecutionState::Running);
    assert_eq!(
        list(running).await,
        [(third.to_string(), ExecutionState::Running)]
    );
    let mut cancelled = all.clone();
    cancelled.state = Some(ExecutionState::Ended(ExecutionStatus::Cancelled));
    assert_eq!(list(cancelled).await.len(), 1);
    let mut orders = all.clone();
    orders.tool = Some("create_order".to_owned());
    assert_eq!(list(orders).await.len(), 2);
    let bobs_list = store.executions(&bob, &all).await.unwrap();
    assert_eq!(bobs_list.len(), 1);
    assert_eq!(bobs_list[0].execution_id, bobs);
}

#[tokio::test]
async fn memory_keeps_executions() {
    executions_contract(&MemoryStore::new(), "memory").await;
}

#[tokio::test]
async fn file_keeps_executions() {
    let file = TempFile::new("executions");
    executions_contract(&file_store(&file).await, "file").await;
}

#[tokio::test]
async fn postgres_keeps_executions() {
    let Some(store) = postgres_store().await else {
        return;
    };
    executions_contract(&store, "postgres").await;
}

#[tokio::test]
async fn redis_keeps_executions() {
    let Some(store) = redis_store().await else {
        return;
    };
    executions_contract(&store, "redis").await;
}
