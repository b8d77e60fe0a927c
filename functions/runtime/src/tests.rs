use std::sync::{Arc, Mutex};

use entrega_core::ports::SystemRandom;

use super::*;

#[test]
fn a_handler_outcome_settles_its_message() {
    assert_eq!(
        Settlement::of(&Ok(Disposition::Done), 1, &SystemRandom),
        Settlement::Delete
    );
    let later = Duration::from_secs(42);
    assert_eq!(
        Settlement::of(&Ok(Disposition::RetryIn(later)), 7, &SystemRandom),
        Settlement::Hide(later)
    );
}

#[test]
fn a_backend_error_hides_the_message_longer_with_each_receive_up_to_a_cap() {
    let error = Err(StoreError::Backend("throttled".into()));
    let hidden = |receives| match Settlement::of(&error, receives, &SystemRandom) {
        Settlement::Hide(delay) => delay,
        Settlement::Delete => panic!("a backend error never deletes the message"),
    };
    // Jitter spreads each step over [half, full]: compare the steps' floors.
    assert!(hidden(1) >= BACKEND_ERROR_BACKOFF / 2);
    assert!(hidden(1) <= BACKEND_ERROR_BACKOFF);
    assert!(hidden(5) >= BACKEND_ERROR_BACKOFF * 16 / 2);
    for receives in [20, 100, u32::MAX] {
        assert!(hidden(receives) <= BACKEND_ERROR_BACKOFF_MAX);
        assert!(hidden(receives) >= BACKEND_ERROR_BACKOFF_MAX / 2);
    }
}

#[test]
fn loop_backoff_doubles_to_its_cap_and_starts_over_after_a_reset() {
    let mut backoff = LoopBackoff::default();
    assert_eq!(backoff.next_pause(), LOOP_BACKOFF_START);
    assert_eq!(backoff.next_pause(), LOOP_BACKOFF_START * 2);
    for _ in 0..20 {
        backoff.next_pause();
    }
    assert_eq!(backoff.next_pause(), LOOP_BACKOFF_MAX);
    backoff.reset();
    assert_eq!(backoff.next_pause(), LOOP_BACKOFF_START);
}

#[tokio::test]
async fn the_loop_runs_passes_until_stopped_and_goes_on_after_errors() {
    // Work twice, fail once, find nothing, then stop from inside the last pass.
    let script = Arc::new(Mutex::new(vec![
        Ok(true),
        Ok(true),
        Err(StoreError::Backend("down".into())),
        Ok(false),
    ]));
    let (stop, stopped) = watch::channel(false);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let passes = script.clone();
    poll_until_stopped(
        stopped,
        Duration::from_millis(1),
        move || {
            let passes = passes.clone();
            let stop = stop.clone();
            async move {
                let mut left = passes.lock().unwrap();
                let next = left.remove(0);
                if left.is_empty() {
                    stop.send(true).unwrap();
                }
                next
            }
        },
        move |result| {
            record
                .lock()
                .unwrap()
                .push(result.clone().map_err(|e| e.to_string()))
        },
    )
    .await;
    assert!(script.lock().unwrap().is_empty(), "every pass ran");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(
        seen[2].is_err(),
        "an error is observed and the loop goes on"
    );
    assert_eq!(seen[3], Ok(false));
}
