//! The loop both batchers share: take the next queued item, add every item already queued
//! behind it (within the limits), hand the batch off, repeat — with at most
//! `in_flight_max` batches handed off and unfinished at once. It never waits to fill a
//! batch: while every slot is busy, items queue, and the next batch takes them.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchLimits {
    /// Batches handed off and not finished, at most.
    pub in_flight_max: usize,
    /// Items in one batch, at most.
    pub items_max: usize,
    /// Summed `weight` of one batch, at most (a single item may exceed it alone).
    pub weight_max: usize,
}

/// Runs until the channel closes. `joins(first, next)` says whether `next` may share a batch
/// with the batch's first item; an item that may not (or does not fit) starts the next one.
pub(crate) async fn run_batches<T, W, J, S, F>(
    mut rx: mpsc::Receiver<T>,
    limits: BatchLimits,
    weight: W,
    joins: J,
    send: S,
) where
    T: Send + 'static,
    W: Fn(&T) -> usize,
    J: Fn(&T, &T) -> bool,
    S: Fn(Vec<T>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.in_flight_max));
    let mut carried: Option<T> = None;
    loop {
        // A slot first: while every slot is busy, items queue up and join the next batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(item) => item,
            None => match rx.recv().await {
                Some(item) => item,
                None => return,
            },
        };
        let mut total = weight(&first);
        let mut batch = vec![first];
        while batch.len() < limits.items_max {
            match rx.try_recv() {
                Ok(item)
                    if !joins(&batch[0], &item)
                        || total.saturating_add(weight(&item)) > limits.weight_max =>
                {
                    carried = Some(item);
                    break;
                }
                Ok(item) => {
                    total = total.saturating_add(weight(&item));
                    batch.push(item);
                }
                Err(_) => break,
            }
        }
        let done = send(batch);
        tokio::spawn(async move {
            let _slot = slot;
            done.await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn queued_items_share_batches_within_the_limits_and_order_is_kept() {
        let (tx, rx) = mpsc::channel(64);
        // Queued before the loop starts: the first batch takes what fits.
        for item in [1usize, 1, 1, 5, 1, 2, 2, 2, 2, 2] {
            tx.send(item).await.unwrap();
        }
        drop(tx);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        run_batches(
            rx,
            BatchLimits {
                in_flight_max: 1,
                items_max: 3,
                weight_max: 4,
            },
            |w: &usize| *w,
            // A 2 never joins a batch begun by a 1.
            |first: &usize, next: &usize| !(*first == 1 && *next == 2),
            move |batch| {
                sink.lock().unwrap().push(batch);
                async {}
            },
        )
        .await;
        tokio::task::yield_now().await;
        let batches = seen.lock().unwrap().clone();
        assert_eq!(
            batches,
            vec![
                vec![1, 1, 1], // items_max
                vec![5],       // heavier than weight_max alone
                vec![1],       // the 2 may not join
                vec![2, 2],    // weight_max
                vec![2, 2],
                vec![2],
            ]
        );
    }
}
