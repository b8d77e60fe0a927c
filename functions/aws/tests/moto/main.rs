//! The AWS runtime against a local emulator (moto server, started by each test): the
//! real SDK calls, the table stream, queues, visibility changes and schedules.

mod concurrency;
mod delivery;
mod harness;
mod lambda_events;
mod operations;
mod provisioning;
mod restart;
mod retries;
mod support;
mod sweep;
