//! `coordinator serve`: opens the sled store, starts the Raft node, the gRPC server (API, agents, peers), the
//! Prometheus endpoint and the planning loop, and runs until SIGINT or SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use tessera_proto::v1;
use tokio::net::TcpListener;

use crate::config::CoordinatorConfig;
use crate::metrics::Metrics;
use crate::planning::{Planner, PlanningSettings};
use crate::replica::Replica;
use crate::service::{RaftService, Services};
use crate::storage::SledStore;
use crate::transport::{MAX_MESSAGE_BYTES, Transport};

pub use crate::limits::{
    KEEPALIVE, MAX_AGENT_REQUEST_BYTES, MAX_API_REQUEST_BYTES, MAX_IN_FLIGHT_PER_CONNECTION,
    MAX_STREAMS_PER_CONNECTION, UNARY_DEADLINE,
};

/// Runs a coordinator node until SIGINT or SIGTERM (or a fatal error); prints `coordinator id=N addr=HOST:PORT`
/// (and `metrics=HOST:PORT`) once serving.
pub async fn serve(config: CoordinatorConfig) -> anyhow::Result<()> {
    serve_until(config, shutdown_signal(), |id, addr, metrics| match metrics {
        Some(m) => println!("coordinator id={id} addr={addr} metrics={m}"),
        None => println!("coordinator id={id} addr={addr}"),
    })
    .await
}

/// Runs a coordinator node until `shutdown` completes; `ready` is called with the node id, the bound gRPC address
/// and the bound metrics address once the node serves (several nodes may run in one process: `coordinator dev-cluster`).
pub async fn serve_until(
    config: CoordinatorConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(u64, std::net::SocketAddr, Option<std::net::SocketAddr>),
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    serve_on(config, listener, shutdown, ready).await
}

/// [`serve_until`] on a listener the caller has already bound (`config.listen` is then only what it reports).
/// `coordinator dev-cluster` binds every replica's port before starting any, so that no port it chose can be taken
/// in between, for example by a replica dialling a peer that is not up yet.
pub async fn serve_on(
    config: CoordinatorConfig,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(u64, std::net::SocketAddr, Option<std::net::SocketAddr>),
) -> anyhow::Result<()> {
    let models = match &config.models_dir {
        Some(dir) => tessera_core::config::load_model_dir(dir).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => Default::default(),
    };
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| anyhow::anyhow!("cannot create data_dir {}: {e}", config.data_dir.display()))?;
    // Read the certificates first: bad files stop the start-up with the file named.
    let server_tls = match &config.tls {
        Some(files) => Some(tessera_auth::ServerTls::new(files.clone()).map_err(|e| anyhow::anyhow!("TLS: {e}"))?),
        None => None,
    };
    let store = SledStore::open(&config.data_dir.join("raft"))
        .map_err(|e| anyhow::anyhow!("cannot open the Raft store in {}: {e}", config.data_dir.display()))?;
    let metrics = Arc::new(Metrics::new());
    let transport =
        Transport::new(config.raft.id, config.advertise.clone(), tokio::runtime::Handle::current(), config.tls.clone());
    let node =
        Replica::start(config.raft.clone(), store, config.peers.clone(), config.join, transport, Arc::clone(&metrics))?;
    let planner = Planner::new(
        node.clone(),
        PlanningSettings {
            policy: config.policy.clone(),
            round: config.round.clone(),
            interference: config.interference.clone(),
            clock: config.clock,
            push_timeout: Duration::from_secs(5),
            failure_detection: config.failure_detection.clone(),
            tls: config.tls.clone(),
        },
        Arc::clone(&metrics),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let mut admission = tessera_auth::Admission::default();
    let auth = match &config.tls {
        Some(_) => {
            let m = Arc::clone(&metrics);
            // A revoked certificate speaks for nobody; a coordinator certificate is a member's only while its CN
            // names a current member: one the CA issued to `node-9`, or to a member since removed, is nobody's.
            let members = node.clone();
            let pins = config.member_pins.clone();
            let gate: tessera_auth::Gate = Arc::new(move |who| match who.role {
                _ if members.is_revoked(&who.serial) => {
                    Err(format!("its certificate (serial {}) was revoked (coordinator certs revoked)", who.serial))
                }
                tessera_auth::Role::Coordinator => match who.member_id() {
                    // A pinned member is itself only with the one certificate pinned for it.
                    Some(id) if pins.get(&id).is_some_and(|pin| *pin != who.fingerprint) => Err(format!(
                        "its certificate ({}) is not the one pinned for member {id} (member_pins)",
                        who.fingerprint
                    )),
                    Some(id) if members.is_member(id) => Ok(()),
                    _ => Err(format!(
                        "it is not a member of this cluster (members: {})",
                        members.members_known().iter().map(|id| format!("node-{id}")).collect::<Vec<_>>().join(", ")
                    )),
                },
                _ => Ok(()),
            });
            // A revoked certificate fails its handshake too, before any request is read (a connection opened
            // before the revocation meets the gate on each call); at most `MAX_CONNECTIONS_PER_IDENTITY`
            // connections per certificate identity.
            if let Some(tls) = &server_tls {
                let list = node.clone();
                tls.set_revoked(Arc::new(move |serial| list.is_revoked(serial)));
            }
            let counted = Arc::clone(&m);
            admission.on_refusal = Some(Arc::new(move |kind, _| counted.auth_refusal(kind)));
            tessera_auth::Auth::mutual_tls().on_refusal(Arc::new(move |kind, _| m.auth_refusal(kind))).gate(gate)
        }
        None => {
            tracing::warn!(
                "no TLS: any client that reaches this port may do anything (use --tls-cert/--tls-key/--tls-ca)"
            );
            tessera_auth::Auth::insecure()
        }
    };
    let services = Services::new(node.clone(), Arc::clone(&planner), auth.clone(), config.tls.clone());
    // Peers' Raft streams never end by themselves; the graceful shutdown would wait for them forever, so they are
    // ended when it starts.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stopping_tx.send(true);
    };
    // The partition RPC exists only in builds made for fault tests.
    // The Raft service takes messages up to a snapshot's size, so its caller is checked before the body is read:
    // a member's certificate (a current member's), or nothing is decoded (a reader's 200 MiB `Step` once cost a
    // member 400 MiB before it was refused).
    let raft_gate = auth.clone();
    let raft = RaftService::new(
        node.clone(),
        cfg!(feature = "fault-injection") && config.allow_fault_injection,
        Arc::clone(&metrics),
        auth,
        stopping,
    );

    {
        // The per-GPU families are read from the replicated state when scraped, so they cost nothing between.
        let node = node.clone();
        metrics.set_gpu_source(move || node.read(|s| crate::metrics::gpu_gauges(&s.fleet)));
    }
    let mut metrics_addr = None;
    if let Some(addr) = config.metrics_listen {
        let l =
            TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr} for /metrics: {e}"))?;
        metrics_addr = Some(l.local_addr()?);
        let m = Arc::clone(&metrics);
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(l, m).await {
                tracing::error!(error = %e, "the /metrics server stopped");
            }
        });
    }
    {
        let node = node.clone();
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let mut applied = node.watch_applied();
            while applied.changed().await.is_ok() {
                let (t, g) = node.read(|s| (s.fleet.tenants.len(), s.fleet.gpus.len()));
                metrics.set_fleet(t, g);
                // At most five refreshes a second, not one per write: the changes meanwhile are seen after it.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
    tokio::spawn(Arc::clone(&planner).run(models));

    let local = listener.local_addr()?;
    tracing::info!(id = config.raft.id, listen = %local, advertise = %config.advertise, peers = ?config.peers, "coordinator serving");
    // Scripts and tests read this line to learn the bound address.
    ready(config.raft.id, local, metrics_addr);
    // Certificates are reloaded on SIGHUP or when their files change; outgoing connections are then reopened so
    // peers and agents see the new certificate too.
    let _reload = server_tls.as_ref().map(|tls| {
        let transport = node.transport().clone();
        let planner = Arc::clone(&planner);
        let services = services.clone();
        tls.watch(move || {
            transport.renew_channels();
            planner.forget_agent_channels();
            services.forget_channels();
        })
    });
    #[cfg(unix)]
    if server_tls.is_none() {
        // `systemctl reload` sends SIGHUP: without certificates there is nothing to reload, and it must not stop us.
        if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: no TLS certificates to reload");
                }
            });
        }
    }
    let raft = tonic::service::interceptor::InterceptedService::new(
        v1::raft_server::RaftServer::new(raft)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        move |req: tonic::Request<()>| {
            raft_gate.check(&req, tessera_auth::Need::RaftPeer)?;
            Ok(req)
        },
    );
    let router = tonic::transport::Server::builder()
        // Bounded: a flood cannot queue unbounded work on one connection, and no client request (a tenant, a
        // registration, a heartbeat) comes near these sizes legitimately.
        .concurrency_limit_per_connection(MAX_IN_FLIGHT_PER_CONNECTION)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE))
        // A unary call, its body read included, is answered within the deadline or ended (a half-sent body once
        // held 1 MiB per stream for as long as its sender liked).
        .layer(tessera_auth::deadline::UnaryDeadline {
            limit: config.call_deadline,
            long_lived: &tessera_auth::deadline::LONG_LIVED,
        })
        .add_service(
            v1::coordinator_api_server::CoordinatorApiServer::new(services.clone())
                .max_decoding_message_size(MAX_API_REQUEST_BYTES),
        )
        .add_service(
            v1::coordinator_server::CoordinatorServer::new(services).max_decoding_message_size(MAX_AGENT_REQUEST_BYTES),
        )
        .add_service(raft);
    match server_tls {
        Some(tls) => {
            let incoming = tessera_auth::incoming_admitted(listener, tls, admission);
            router.serve_with_incoming_shutdown(incoming, shutdown).await?
        }
        None => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            router.serve_with_incoming_shutdown(incoming, shutdown).await?;
        }
    }
    tracing::info!("coordinator stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
