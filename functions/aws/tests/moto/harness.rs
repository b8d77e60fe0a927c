//! A moto server on a free loopback port, started for a test and stopped with it, and
//! a provisioned Entrega stack on it with the local pollers running.

use std::sync::Arc;

use aws_sdk_dynamodb::config::Credentials;
use entrega_aws::emulation::Emulation;
use entrega_aws::provision::provision;
use entrega_aws::resources::{aws_services, AwsResources, ResourceNames};
use entrega_core::ports::{Clock, Services, SystemClock};
use entrega_http::transport::{HttpTransport, TargetPolicy};
use entrega_testkit::Moto;
use tokio::sync::watch;

/// The SDK configured for a test's moto server.
pub async fn sdk(moto: &Moto) -> aws_config::SdkConfig {
    entrega_aws::resources::sdk_defaults()
        .endpoint_url(&moto.endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
        .load()
        .await
}

/// A provisioned stack with its pollers running until dropped.
pub struct Stack {
    _moto: Moto,
    pub sdk: aws_config::SdkConfig,
    pub names: ResourceNames,
    pub resources: AwsResources,
    pub services: Services,
    stop: watch::Sender<bool>,
    stopped: Option<watch::Receiver<bool>>,
}

impl Stack {
    pub async fn start() -> Self {
        Self::start_with_clock(Arc::new(SystemClock)).await
    }

    pub async fn start_with_clock(clock: Arc<dyn Clock>) -> Self {
        let mut stack = Self::provisioned(clock).await;
        stack.start_pollers();
        stack
    }

    /// Provisioned, with no pollers running yet.
    pub async fn provisioned(clock: Arc<dyn Clock>) -> Self {
        let moto = Moto::start();
        let sdk = sdk(&moto).await;
        let names = ResourceNames::with_prefix("entrega-test");
        provision(&sdk, &names).await.expect("provisioning on moto");
        let resources = AwsResources::discover(&sdk, "entrega-test")
            .await
            .expect("resources found");
        let transport = Arc::new(HttpTransport::new(TargetPolicy {
            allowed_ranges: vec!["127.0.0.0/8".parse().unwrap()],
            allow_http: true,
        }));
        let services = aws_services(&sdk, &resources, transport, clock);
        let (stop, rx) = watch::channel(false);
        Self {
            _moto: moto,
            sdk,
            names,
            resources,
            services,
            stop,
            stopped: Some(rx),
        }
    }

    /// Start the pollers that play Lambda's event source mappings and the scheduler.
    pub fn start_pollers(&mut self) {
        let rx = self.stopped.take().expect("pollers start once");
        tokio::spawn(self.emulation().run(rx));
    }

    pub fn emulation(&self) -> Emulation {
        Emulation {
            services: self.services.clone(),
            resources: self.resources.clone(),
            clients: entrega_aws::resources::AwsClients::new(&self.sdk),
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
