//! Mutual TLS and roles on a real 3-process cluster: a development PKI from `coordinator certs init`, members that
//! talk TLS to each other, and callers who may do what their certificate's role allows and nothing more.

mod support;

use std::time::Duration;

use support::cluster::{Cluster, binary, eventually, start_sim_tls, tenant, tls_files};
use tessera_proto::v1;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;
use tonic::Code;

const T: Duration = Duration::from_secs(30);

fn cli(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(binary()).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_may_do_what_their_certificates_allow_and_nothing_more() {
    let pki = tempfile::tempdir().unwrap();
    let dir = pki.path().to_string_lossy().into_owned();
    let (ok, out, err) = cli(&["certs", "init", "--out", &dir, "--nodes", "3", "--agent", "node-0"]);
    assert!(ok, "{err}");
    assert!(out.contains("node-3:") && out.contains("reader:"), "{out}");

    let c = Cluster::start_tls(3, &["--metrics-listen", "127.0.0.1:0"], pki.path());
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let via = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();
    let as_ = |name: &str| CoordinatorApiClient::new(c.channel_as(via, Some(&tls_files(pki.path(), name))));
    let add = |name: &str, id: &str| {
        let mut client = as_(name);
        let spec = tenant(id, "resnet50", 1.0);
        async move { client.create_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await }
    };

    // An operator writes through a follower (which forwards over TLS to the leader); a reader reads it.
    eventually(T, "an operator's tenant to be created", || async { add("operator", "t1").await.ok() }).await;
    let list = as_("reader").list_tenants(v1::ListRequest { stale: false }).await.unwrap().into_inner();
    assert_eq!(list.tenants.len(), 1);

    // A reader may not write; an agent may not read the API, add members or speak for another node.
    let e = add("reader", "t2").await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("reader `reader`") && e.message().contains("operator"), "{e:?}");
    let e = as_("node-0").list_tenants(v1::ListRequest { stale: false }).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = as_("node-0").add_member(v1::AddMemberRequest { id: 9, address: "127.0.0.1:1".into() }).await;
    assert_eq!(e.unwrap_err().code(), Code::PermissionDenied);
    // A member's own certificate (a compromised member) may speak only as itself, and may not move the cluster to a
    // term far beyond its own: one forged heartbeat with term 10^12 moved every member there before.
    let bystander = [1, 2, 3].into_iter().find(|i| *i != leader && *i != via).unwrap();
    let mut member =
        v1::raft_client::RaftClient::new(c.channel_as(via, Some(&tls_files(pki.path(), &format!("node-{bystander}")))));
    let heartbeat = |from: u64, term: u64| {
        let mut m = raft::prelude::Message::default();
        m.set_msg_type(raft::prelude::MessageType::MsgHeartbeat);
        (m.from, m.to, m.term) = (from, via, term);
        v1::RaftBatch {
            from,
            from_address: String::new(),
            messages: vec![protobuf::Message::write_to_bytes(&m).unwrap()],
        }
    };
    let e = member.step(heartbeat(leader, 5)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "a member may not speak for another: {e:?}");
    let e = member.step(heartbeat(bystander, 1_000_000_000_000)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("beyond this member's term"), "{e:?}");
    // The same on the stream members send on: the first batch must come from the certificate's member, and every
    // later batch from the same member as the first.
    let stream = |batches: Vec<v1::RaftBatch>| {
        let mut member = member.clone();
        async move { member.step_stream(tokio_stream::iter(batches)).await }
    };
    let e = stream(vec![heartbeat(leader, 5)]).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "a member may not speak for another on a stream: {e:?}");
    let e = stream(vec![heartbeat(bystander, 1), heartbeat(leader, 1)]).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("on a stream from"), "{e:?}");
    let e = stream(vec![heartbeat(bystander, 1), heartbeat(bystander, 1_000_000_000_000)]).await.unwrap_err();
    assert!(e.message().contains("beyond this member's term"), "{e:?}");
    let status = as_("reader").cluster_status(v1::ClusterStatusRequest {}).await.unwrap().into_inner();
    assert!(status.term < 1_000, "the forged term moved nothing: {}", status.term);
    // Nor may it redirect what the receiver sends it: the address a batch names is not believed (2,148 such calls
    // left the cluster leaderless before).
    let address_of = |s: &v1::ClusterStatusResponse| {
        s.members.iter().find(|m| m.id == bystander).map(|m| m.address.clone()).unwrap_or_default()
    };
    let before = address_of(&status);
    for _ in 0..50 {
        let hijack = v1::RaftBatch { from: bystander, from_address: "127.0.0.1:1".into(), messages: vec![] };
        member.step(hijack).await.unwrap();
    }
    let mut via_status = CoordinatorApiClient::new(c.channel_as(via, Some(&tls_files(pki.path(), "reader"))));
    let after = via_status.cluster_status(v1::ClusterStatusRequest {}).await.unwrap().into_inner();
    assert_eq!(address_of(&after), before, "the member's address is still the configured one");
    eventually(T, "a write after the hijack attempts", || async { add("operator", "t-after-hijack").await.ok() }).await;
    let e = as_("operator").remove_member(v1::RemoveMemberRequest { id: 3 }).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "membership is the admin's");
    let mut agent =
        v1::coordinator_client::CoordinatorClient::new(c.channel_as(via, Some(&tls_files(pki.path(), "node-0"))));
    let register =
        |node: &str| v1::RegisterRequest { node_id: node.into(), address: "127.0.0.1:1".into(), gpus: vec![] };
    let e = agent.register(register("node-1")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("agent of node node-1"), "{e:?}");
    agent.register(register("node-0")).await.unwrap();
    // An agent speaks only for the tenants placed on its node (none: it has no GPUs yet). Counters for another
    // tenant are dropped and counted, not believed (one such heartbeat once made t1's forecast 657,000 rps).
    let forged = v1::TenantMetrics {
        tenant: "t1".into(),
        arrivals: 1_000_000_000,
        accuracy: 0.01,
        slot_rates: vec![657_000.0],
        ..Default::default()
    };
    let state = v1::NodeState {
        node_id: "node-0".into(),
        metrics: Some(v1::WorkloadMetrics { now_ms: 1_000, tenants: vec![forged] }),
        ..Default::default()
    };
    let r =
        agent.heartbeat(v1::HeartbeatRequest { state: Some(state), revocations_index: 0 }).await.unwrap().into_inner();
    assert!(r.registered, "{r:?}");
    // A client certificate cannot speak Raft for a member.
    let mut raft = v1::raft_client::RaftClient::new(c.channel_as(via, Some(&tls_files(pki.path(), "admin"))));
    let e = raft.step(v1::RaftBatch { from: leader, from_address: "127.0.0.1:1".into(), messages: vec![] }).await;
    assert_eq!(e.unwrap_err().code(), Code::PermissionDenied);
    // The admin still reaches the Raft service's own admin call (fault injection, off on this cluster): the check
    // made before a Raft body is read lets members and admins through.
    let e = raft.isolate(v1::IsolateRequest { peers: vec![] }).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("fault injection is off"), "{e:?}");
    let batch = v1::RaftBatch { from: leader, from_address: String::new(), messages: vec![] };
    let e = raft.step_stream(tokio_stream::iter(vec![batch])).await;
    assert_eq!(e.unwrap_err().code(), Code::PermissionDenied);
    // ... and is refused before its body is read: a 64 MiB `Step` from a reader costs the member no memory (it
    // was decoded first, and refused after: 200 MiB once took a member from 23 to 424 MiB).
    // The member's peak resident memory (VmHWM): what decoding would have cost, even once freed.
    let rss_mib = |pid: u32| -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .unwrap()
            .trim()
            .trim_end_matches(" kB")
            .trim()
            .parse()
            .unwrap();
        kb / 1024.0
    };
    let pid = c.pid(via).unwrap();
    let before = rss_mib(pid);
    let huge = v1::RaftBatch { from: leader, from_address: String::new(), messages: vec![vec![7u8; 64 << 20]] };
    let mut reader_raft = v1::raft_client::RaftClient::new(c.channel_as(via, Some(&tls_files(pki.path(), "reader"))))
        .max_encoding_message_size(usize::MAX);
    let e = reader_raft.step(huge).await.unwrap_err();
    assert!(matches!(e.code(), Code::PermissionDenied | Code::Cancelled | Code::Unknown | Code::Internal), "{e:?}");
    let after = rss_mib(pid);
    assert!(
        after - before < 32.0,
        "a refused 64 MiB Raft body took the member's peak from {before:.0} to {after:.0} MiB"
    );

    // A member's certificate used for a write directly is audited as the member (checked with the log below), and
    // a coordinator certificate from the same CA whose CN names no member is refused everywhere.
    add(&format!("node-{bystander}"), "by-a-member").await.unwrap();
    let (ok, _, err) = cli(&["certs", "issue", "--dir", &dir, "--name", "node-9", "--role", "coordinator"]);
    assert!(ok, "{err}");
    let e = add("node-9", "by-a-stranger").await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("not a member of this cluster"), "{e:?}");
    let e = as_("node-9").list_tenants(v1::ListRequest { stale: false }).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let mut stranger = v1::raft_client::RaftClient::new(c.channel_as(via, Some(&tls_files(pki.path(), "node-9"))));
    let e = stranger.step(heartbeat(9, 5)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "a certificate of no member speaks no Raft: {e:?}");
    let status = as_("reader").cluster_status(v1::ClusterStatusRequest {}).await.unwrap().into_inner();
    assert_ne!(status.leader_id, 9, "{status:?}");

    // No certificate at all: the TLS handshake itself fails (the server requires one), and plaintext is refused.
    let mut plain = CoordinatorApiClient::new(c.channel_as(via, None));
    assert!(plain.cluster_status(v1::ClusterStatusRequest {}).await.is_err());

    // The CLI with certificates: an admin changes membership; a reader's write is refused with the role named.
    let endpoints = c.endpoints();
    let flags = |name: &str| {
        let f = tls_files(pki.path(), name);
        [f.cert, f.key, f.ca].map(|p| p.to_string_lossy().into_owned())
    };
    let [cert, key, ca] = flags("reader");
    let (ok, out, err) =
        cli(&["tenant", "list", "--endpoints", &endpoints, "--tls-cert", &cert, "--tls-key", &key, "--tls-ca", &ca]);
    assert!(ok && out.contains("t1"), "{err}");
    let (ok, _, err) = cli(&[
        "tenant",
        "rm",
        "t1",
        "--endpoints",
        &endpoints,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-ca",
        &ca,
    ]);
    assert!(!ok && err.contains("operator"), "{err}");
    assert!(err.starts_with("error: tenant t1: permission denied: reader `reader` may not"), "{err}");
    let code = |args: &[&str]| std::process::Command::new(binary()).args(args).output().unwrap().status.code();
    assert_eq!(
        code(&[
            "tenant",
            "rm",
            "t1",
            "--endpoints",
            &endpoints,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-ca",
            &ca
        ]),
        Some(4),
        "a refusal exits with 4"
    );
    let (ok, _, err) = cli(&["status", "--endpoints", &endpoints, "--tls-cert", &cert]);
    assert!(!ok && err.contains("--tls-key, --tls-ca"), "{err}");
    assert_eq!(code(&["status", "--endpoints", &endpoints, "--tls-cert", &cert]), Some(2), "usage");
    // The same from the environment (TESSERA_ENDPOINTS, TESSERA_TLS_CERT/KEY/CA), as a shell profile would set it.
    let out = std::process::Command::new(binary())
        .args(["tenant", "list"])
        .envs([("TESSERA_ENDPOINTS", &endpoints), ("TESSERA_TLS_CERT", &cert), ("TESSERA_TLS_KEY", &key)])
        .env("TESSERA_TLS_CA", &ca)
        .output()
        .unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("t1"), "{out:?}");

    // A node agent over mutual TLS: it registers as itself, the leader pushes it a plan (presenting a member's
    // certificate and checking the agent's), and nobody else may push to it.
    let sim = start_sim_tls(&c.endpoints(), 1, 1, tessera_sim::node::ClockKind::Wall, "node", Some(pki.path())).await;
    let agent_addr = sim.addr(0);
    as_("operator").trigger_plan(v1::TriggerPlanRequest {}).await.ok();
    eventually(T, "the TLS agent to apply a plan serving t1", || async {
        as_("operator").trigger_plan(v1::TriggerPlanRequest {}).await.ok();
        let r = as_("reader").list_nodes(v1::ListRequest { stale: false }).await.ok()?.into_inner();
        r.nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .any(|g| g.applied_assignments.iter().any(|a| a.tenant == "t1"))
            .then_some(())
    })
    .await;
    let agent_channel = |name: &str| {
        let f = tls_files(pki.path(), name);
        tonic::transport::Endpoint::from_shared(format!("https://{agent_addr}"))
            .unwrap()
            .tls_config(f.client("node-0").unwrap())
            .unwrap()
            .connect_lazy()
    };
    let mut rogue = v1::agent_client::AgentClient::new(agent_channel("operator"));
    let e = rogue
        .apply_layout(v1::ApplyLayoutRequest { epoch: 1 << 63, targets: vec![], term: 1, jobs: vec![] })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("coordinator member"), "{e:?}");
    let mut reader = v1::agent_client::AgentClient::new(agent_channel("reader"));
    let st = reader.get_state(v1::GetStateRequest {}).await.unwrap().into_inner();
    assert!(st.epoch > 0 && st.epoch < 1 << 63, "the rogue push changed nothing: {}", st.epoch);
    // A certificate from another CA is refused in the handshake.
    let other = tempfile::tempdir().unwrap();
    tessera_auth::init_pki(other.path(), 1, &[], &[], tessera_auth::CERT_LIFETIME_DAYS).unwrap();
    let f = tls_files(other.path(), "node-1");
    let foreign = tonic::transport::Endpoint::from_shared(format!("https://{agent_addr}"))
        .unwrap()
        .tls_config(f.client("node-0").unwrap())
        .unwrap()
        .connect_lazy();
    let mut foreign = v1::agent_client::AgentClient::new(foreign);
    assert!(
        foreign
            .apply_layout(v1::ApplyLayoutRequest { epoch: 2, targets: vec![], term: 1, jobs: vec![] })
            .await
            .is_err()
    );
    // Not even a member's certificate (a compromised member) can freeze the node: the agent takes layouts only from
    // the leader the coordinators name, at its term, with an epoch near the committed one. Before, a push with epoch
    // 2^63 made every later push stale.
    let term = as_("reader").cluster_status(v1::ClusterStatusRequest {}).await.unwrap().into_inner().term;
    let next = st.epoch + 1;
    let mut member = v1::agent_client::AgentClient::new(agent_channel(&format!("node-{bystander}")));
    let e = member
        .apply_layout(v1::ApplyLayoutRequest { epoch: next, targets: vec![], term, jobs: vec![] })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(&format!("which member {leader} leads")), "{e:?}");
    // Nor by claiming the next term with an epoch a little ahead: the agent believes a newer term or epoch only
    // when the coordinators say so (this push once wiped the node's GPU and froze it for minutes).
    let e = member
        .apply_layout(v1::ApplyLayoutRequest { epoch: next + 63, targets: vec![], term: term + 1, jobs: vec![] })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("beyond the known term"), "{e:?}");
    let mut leader_push = v1::agent_client::AgentClient::new(agent_channel(&format!("node-{leader}")));
    for (epoch, term, says) in [
        (1 << 63, term, "beyond the newest committed plan epoch"),
        (next + 63, term, "beyond the newest committed plan epoch"),
        (next, term - 1, "leads term"),
        (next, 1_000_000_000_000, "beyond the known term"),
    ] {
        let e = leader_push.apply_layout(v1::ApplyLayoutRequest { epoch, targets: vec![], term, jobs: vec![] }).await;
        let e = e.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains(says), "{e:?}");
    }
    eventually(T, "a tenant added after the forged pushes to be served", || async {
        add("operator", "t3").await.ok();
        as_("operator").trigger_plan(v1::TriggerPlanRequest {}).await.ok();
        let r = as_("reader").list_nodes(v1::ListRequest { stale: false }).await.ok()?.into_inner();
        r.nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .any(|g| g.applied_assignments.iter().any(|a| a.tenant == "t3"))
            .then_some(())
    })
    .await;

    // Admin and operator actions are in the audit log, on every member, with who did them and the result.
    let [cert, key, ca] = flags("admin");
    let (ok, _, err) =
        cli(&["member", "rm", "9", "--endpoints", &endpoints, "--tls-cert", &cert, "--tls-key", &key, "--tls-ca", &ca]);
    assert!(!ok && err.contains("not a member"), "{err}");
    for id in [1, 2, 3] {
        let mut client = CoordinatorApiClient::new(c.channel_as(id, Some(&tls_files(pki.path(), "reader"))));
        let log = eventually(T, &format!("member {id} to hold the audit entries"), || {
            let mut client = client.clone();
            async move {
                let r = client.list_audit(v1::ListRequest { stale: true }).await.ok()?.into_inner();
                // A call a follower forwarded is recorded by the leader, naming the follower.
                let by = |e: &v1::AuditEntry, who: &str| {
                    e.who == who || e.who.strip_prefix(who).is_some_and(|via| via.starts_with(" via coordinator:node-"))
                };
                let has =
                    |who: &str, action: &str| r.entries.iter().any(|e| by(e, who) && e.action.starts_with(action));
                let member = format!("coordinator:node-{bystander}");
                (has("operator:operator", "create_tenant t1")
                    && has("admin:admin", "remove_member 9")
                    && has(&member, "create_tenant by-a-member"))
                .then_some(r)
            }
        })
        .await;
        let rm = log.entries.iter().find(|e| e.action.starts_with("remove_member")).unwrap();
        assert!(rm.result.contains("not a member") && rm.at_ms > 0, "{rm:?}");
        let removals = log.entries.iter().filter(|e| e.action.starts_with("remove_member 9")).count();
        assert_eq!(removals, 1, "a forwarded call is audited once: {log:?}");
        let _ = client.list_audit(v1::ListRequest { stale: false }).await.unwrap();
    }

    // Revocation: a second operator's certificate works until an admin revokes it; then every member refuses it,
    // and the list says so (a re-issued certificate's predecessor used to work until it expired).
    let (ok, _, err) = cli(&["certs", "issue", "--dir", &dir, "--name", "op2", "--role", "operator"]);
    assert!(ok, "{err}");
    add("op2", "by-op2").await.unwrap();
    // Connections op2 opens before the revocation: they stay open, and each call on them meets the gate.
    let mut before = Vec::new();
    for id in [1, 2, 3] {
        let mut client = CoordinatorApiClient::new(c.channel_as(id, Some(&tls_files(pki.path(), "op2"))));
        client.list_tenants(v1::ListRequest { stale: true }).await.unwrap();
        before.push(client);
    }
    let mut op2_at_agent = v1::agent_client::AgentClient::new(agent_channel("op2"));
    op2_at_agent.get_state(v1::GetStateRequest {}).await.expect("a reader's call to the agent");
    let [cert, key, ca] = flags("admin");
    let op2 = pki.path().join("op2.pem").to_string_lossy().into_owned();
    let admin = ["--endpoints", &endpoints, "--tls-cert", &cert, "--tls-key", &key, "--tls-ca", &ca];
    let (ok, out, err) = cli(&[&["certs", "revoke", "--cert", &op2][..], &admin[..]].concat());
    assert!(ok && out.contains("revoked"), "{out}{err}");
    for (id, open) in [1, 2, 3].into_iter().zip(before) {
        let e = eventually(T, &format!("member {id} to refuse the revoked certificate"), || {
            let mut client = open.clone();
            async move { client.list_tenants(v1::ListRequest { stale: true }).await.err() }
        })
        .await;
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("revoked"), "{e:?}");
        // A new connection does not get past its TLS handshake: the call fails in the transport (the client sees the
        // `certificate_revoked` alert, or the connection closed under a request that raced the alert; auth's reload
        // test checks the alert itself), never at the gate.
        let mut fresh = CoordinatorApiClient::new(c.channel_as(id, Some(&tls_files(pki.path(), "op2"))));
        let e = fresh.list_tenants(v1::ListRequest { stale: true }).await.unwrap_err();
        assert!(matches!(e.code(), Code::Unavailable | Code::Unknown | Code::Cancelled), "member {id}: {e:?}");
        assert!(format!("{e:?}").contains("tonic::transport::Error"), "member {id}: {e:?}");
        let mut client = CoordinatorApiClient::new(c.channel_as(id, Some(&tls_files(pki.path(), "operator"))));
        client.list_tenants(v1::ListRequest { stale: true }).await.unwrap();
    }
    let (ok, out, err) = cli(&[&["certs", "revoked"][..], &admin[..]].concat());
    assert!(ok && out.contains("operator op2"), "{out}{err}");
    // The agent learns the list from its next heartbeat's answer: the connection op2 opened before is refused at
    // the gate, and a new one in its handshake.
    let e = eventually(T, "the agent to refuse the revoked certificate", || {
        let mut open = op2_at_agent.clone();
        async move { open.get_state(v1::GetStateRequest {}).await.err() }
    })
    .await;
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("revoked"), "{e:?}");
    let mut fresh = v1::agent_client::AgentClient::new(agent_channel("op2"));
    let e = fresh.get_state(v1::GetStateRequest {}).await.unwrap_err();
    assert!(format!("{e:?}").contains("tonic::transport::Error"), "{e:?}");
    reader.get_state(v1::GetStateRequest {}).await.expect("an unrevoked certificate is still served");
    sim.stop().await;

    // Refusals are counted.
    let body = http_get(&c.metrics_addr(via).unwrap()).await;
    let denied = body
        .lines()
        .find(|l| l.starts_with("tessera_coordinator_auth_refusals_total{kind=\"permission_denied\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(denied >= 5.0, "{body}");
    // The forged counters were refused where heartbeats are handled: on the leader of the time.
    let mut foreign = 0.0;
    for id in [1, 2, 3] {
        let body = http_get(&c.metrics_addr(id).unwrap()).await;
        foreign += body
            .lines()
            .find(|l| l.starts_with("tessera_coordinator_auth_refusals_total{kind=\"foreign_tenant\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    assert!(foreign >= 1.0, "a heartbeat's counters for a tenant not on its node were refused");

    // Removing a member revokes the certificates it spoke Raft with, so that were its id added again, they would not
    // speak for it: a connection it opened before is refused as revoked, not only as a non-member.
    let gone = bystander;
    let mut as_gone =
        CoordinatorApiClient::new(c.channel_as(via, Some(&tls_files(pki.path(), &format!("node-{gone}")))));
    as_gone.list_tenants(v1::ListRequest { stale: true }).await.expect("a member reads");
    let (ok, out, err) = cli(&[&["member", "rm", &gone.to_string()][..], &admin[..]].concat());
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli(&[&["certs", "revoked"][..], &admin[..]].concat());
    assert!(ok && out.contains(&format!("coordinator node-{gone}")), "{out}{err}");
    let e = eventually(T, "the removed member's certificate to be refused", || {
        let mut open = as_gone.clone();
        async move { open.list_tenants(v1::ListRequest { stale: true }).await.err() }
    })
    .await;
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("revoked"), "{e:?}");
}

/// Rotating a member's certificate: `certs issue` writes a new key and certificate, the member serves the new one
/// without a restart (it watches its files), and the cluster keeps working through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_certificate_rotates_without_a_restart() {
    let pki = tempfile::tempdir().unwrap();
    let dir = pki.path().to_string_lossy().into_owned();
    let (ok, _, err) = cli(&["certs", "init", "--out", &dir, "--nodes", "3"]);
    assert!(ok, "{err}");
    let c = Cluster::start_tls(3, &[], pki.path());
    c.wait_leader(&[1, 2, 3], T).await;
    let addr = c.endpoints().split(',').nth(1).unwrap().trim_start_matches("http://").to_string();
    let reader = tls_files(pki.path(), "reader");
    let served = |addr: String| {
        let reader = reader.clone();
        async move { presented_certificate(&addr, &reader).await }
    };
    let old = served(addr.clone()).await.expect("member 2 answers");
    assert_eq!(old, pem_der(&pki.path().join("node-2.pem")));

    let (ok, out, err) = cli(&["certs", "issue", "--dir", &dir, "--name", "node-2", "--role", "coordinator"]);
    assert!(ok && out.contains("node-2.pem"), "{err}");
    let new = pem_der(&pki.path().join("node-2.pem"));
    assert_ne!(new, old);
    eventually(T, "member 2 to present its new certificate", || {
        let (addr, new) = (addr.clone(), new.clone());
        async move { (served(addr).await? == new).then_some(()) }
    })
    .await;
    // Still a member: it answers with the leader, and an operator's write through it is replicated.
    let mut client = CoordinatorApiClient::new(c.channel_as(2, Some(&tls_files(pki.path(), "operator"))));
    eventually(T, "a write through the rotated member", || {
        let mut client = client.clone();
        async move {
            let spec = tenant("after-rotation", "resnet50", 1.0);
            client.create_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await.ok()
        }
    })
    .await;
    let status = client.cluster_status(v1::ClusterStatusRequest {}).await.unwrap().into_inner();
    assert!(status.leader_id != 0, "{status:?}");
    let (ok, _, err) = cli(&["certs", "issue", "--dir", &dir, "--name", "node-2", "--role", "reader"]);
    assert!(!ok && err.contains("coordinator's certificate"), "{err}");
}

/// With `--member-pins`, a member is believed only with the certificate pinned for it: a second certificate the same
/// CA issued to `node-2` (a CA that signed one too many) is refused on the API and on Raft by every member, naming the
/// pin, while member 2's own certificate still works; a bad pin stops the member at start, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_member_is_believed_only_with_its_own_certificate() {
    let pki = tempfile::tempdir().unwrap();
    let dir = pki.path().to_string_lossy().into_owned();
    let (ok, _, err) = cli(&["certs", "init", "--out", &dir, "--nodes", "3"]);
    assert!(ok, "{err}");
    let fingerprint = |pem: std::path::PathBuf| {
        let (ok, out, err) = cli(&["certs", "fingerprint", "--cert", &pem.to_string_lossy()]);
        assert!(ok && out.starts_with("sha256:"), "{out}{err}");
        out.trim().to_string()
    };
    let pins: Vec<String> =
        (1..=3).map(|id| format!("{id}={}", fingerprint(pki.path().join(format!("node-{id}.pem"))))).collect();
    let forged = tempfile::tempdir().unwrap();
    for f in ["ca.pem", "ca.key"] {
        std::fs::copy(pki.path().join(f), forged.path().join(f)).unwrap();
    }
    let forged_dir = forged.path().to_string_lossy().into_owned();
    let (ok, _, err) = cli(&["certs", "issue", "--dir", &forged_dir, "--name", "node-2", "--role", "coordinator"]);
    assert!(ok, "{err}");
    assert_ne!(fingerprint(forged.path().join("node-2.pem")), pins[1][2..]);

    let c = Cluster::start_tls(3, &["--member-pins", &pins.join(",")], pki.path());
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let mut operator = CoordinatorApiClient::new(c.channel_as(leader, Some(&tls_files(pki.path(), "operator"))));
    eventually(T, "a write on the pinned cluster", || {
        let mut client = operator.clone();
        async move {
            let spec = tenant("pinned", "resnet50", 1.0);
            client.create_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await.ok()
        }
    })
    .await;
    let impostor = tls_files(forged.path(), "node-2");
    for id in [1, 2, 3] {
        let e = CoordinatorApiClient::new(c.channel_as(id, Some(&impostor)))
            .list_tenants(v1::ListRequest { stale: true })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "member {id}: {e:?}");
        assert!(e.message().contains("not the one pinned for member 2"), "member {id}: {e:?}");
        let mut m = raft::prelude::Message::default();
        m.set_msg_type(raft::prelude::MessageType::MsgHeartbeat);
        (m.from, m.to, m.term) = (2, id, 1);
        let batch = v1::RaftBatch {
            from: 2,
            from_address: String::new(),
            messages: vec![protobuf::Message::write_to_bytes(&m).unwrap()],
        };
        let e = v1::raft_client::RaftClient::new(c.channel_as(id, Some(&impostor))).step(batch).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "member {id}: an impostor speaks no Raft: {e:?}");
        let mut own = CoordinatorApiClient::new(c.channel_as(id, Some(&tls_files(pki.path(), "node-2"))));
        own.list_tenants(v1::ListRequest { stale: true }).await.unwrap();
    }
    let status = operator.cluster_status(v1::ClusterStatusRequest {}).await.unwrap().into_inner();
    assert!(status.leader_id != 0, "{status:?}");

    let data = tempfile::tempdir().unwrap();
    let node1 = tls_files(pki.path(), "node-1");
    let (ok, _, err) = cli(&[
        "serve",
        "--id",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &data.path().to_string_lossy(),
        "--member-pins",
        "1=sha256:12",
        "--tls-cert",
        &node1.cert.to_string_lossy(),
        "--tls-key",
        &node1.key.to_string_lossy(),
        "--tls-ca",
        &node1.ca.to_string_lossy(),
    ]);
    assert!(!ok && err.contains("member_pins") && err.contains("64 hex digits"), "{err}");
}

/// The DER of the first certificate in a PEM file.
fn pem_der(path: &std::path::Path) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_file_iter(path).unwrap().next().unwrap().unwrap().to_vec()
}

/// The certificate the server at `addr` presents to a client holding `client`'s files.
async fn presented_certificate(addr: &str, client: &tessera_auth::TlsFiles) -> Option<Vec<u8>> {
    let stream = tls_connect(addr, client).await?;
    Some(stream.get_ref().1.peer_certificates()?.first()?.to_vec())
}

/// A mutual TLS connection to the coordinator at `addr` with `client`'s files, offering HTTP/2.
async fn tls_connect(
    addr: &str,
    client: &tessera_auth::TlsFiles,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::pem_file_iter(&client.ca).ok()?.next()?.ok()?).ok()?;
    let certs = vec![CertificateDer::pem_file_iter(&client.cert).ok()?.next()?.ok()?];
    let key = PrivateKeyDer::from_pem_file(&client.key).ok()?;
    let mut config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .ok()?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let name = ServerName::try_from(tessera_auth::COORDINATOR_SERVER_NAME).ok()?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.ok()
}

async fn http_get(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// A member certificate splits the cluster's terms: forged heartbeats, each within the bound a member believes at
/// first sight, push one member 50,000 terms ahead of the others. The bound used to be final, so the others refused
/// that member for good (and, across restarts, for ever). Now a peer that insists is believed a little further each
/// second: all three follow one leader at one term within seconds, writes go through, and a restart changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_splits_the_terms_does_not_wedge_the_cluster() {
    let pki = tempfile::tempdir().unwrap();
    let dir = pki.path().to_string_lossy().into_owned();
    let (ok, _, err) = cli(&["certs", "init", "--out", &dir, "--nodes", "3"]);
    assert!(ok, "{err}");
    let mut c = Cluster::start_tls(3, &[], pki.path());
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let victim = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();
    let forger = [1, 2, 3].into_iter().find(|i| *i != leader && *i != victim).unwrap();
    let mut member =
        v1::raft_client::RaftClient::new(c.channel_as(victim, Some(&tls_files(pki.path(), &format!("node-{forger}")))));
    let mut term = c.status(victim).await.unwrap().term;
    for _ in 0..5 {
        term += tessera_coordinator::transport::MAX_TERM_STEP - 1;
        let mut m = raft::prelude::Message::default();
        m.set_msg_type(raft::prelude::MessageType::MsgHeartbeat);
        (m.from, m.to, m.term) = (forger, victim, term);
        let batch = v1::RaftBatch {
            from: forger,
            from_address: String::new(),
            messages: vec![protobuf::Message::write_to_bytes(&m).unwrap()],
        };
        member.step(batch).await.unwrap();
        // The next forged term is measured from the one the victim took.
        eventually(T, "the victim to take the forged term", || async {
            (c.status(victim).await?.term >= term).then_some(())
        })
        .await;
    }
    let pushed = c.status(victim).await.unwrap().term;
    assert!(pushed >= term, "the victim took each forged term: {pushed} < {term}");

    // One leader, one term, on all three, and a write: within seconds, not never.
    let started = std::time::Instant::now();
    let healed =
        eventually(T, "all three members to follow one leader at the pushed term", || one_leader(&c, pushed)).await;
    let mut operator = CoordinatorApiClient::new(c.channel_as(leader, Some(&tls_files(pki.path(), "operator"))));
    eventually(T, "a write after the term split", || {
        let spec = tenant("after-split", "resnet50", 1.0);
        let mut client = operator.clone();
        async move { client.create_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await.ok() }
    })
    .await;
    println!("term split by {} terms healed in {:.1} s, at term {healed}", pushed - 1, started.elapsed().as_secs_f64());

    // Restarting every member keeps it healed: nothing of the refusal was persisted.
    for id in [1, 2, 3] {
        c.kill(id);
    }
    for id in [1, 2, 3] {
        c.spawn(id);
    }
    eventually(T, "one leader at one term after restarting all three", || one_leader(&c, pushed)).await;
    operator = CoordinatorApiClient::new(c.channel_as(leader, Some(&tls_files(pki.path(), "reader"))));
    let list = operator.list_tenants(v1::ListRequest { stale: false }).await.unwrap().into_inner();
    assert!(list.tenants.iter().any(|t| t.spec.as_ref().is_some_and(|s| s.id == "after-split")), "{list:?}");
}

/// The term, when all three members follow the same leader at the same term, at least `at_least`.
async fn one_leader(c: &Cluster, at_least: u64) -> Option<u64> {
    let mut seen = Vec::new();
    for id in [1, 2, 3] {
        seen.push(c.status(id).await?);
    }
    let one = seen.iter().all(|s| s.leader_id != 0 && (s.leader_id, s.term) == (seen[0].leader_id, seen[0].term));
    (one && seen[0].term >= at_least).then_some(seen[0].term)
}

/// A member's certificate lying to an agent about who leads (the attacker answers the agent's register and heartbeat
/// calls, as a compromised member would): the agent believes what a majority of the members say, so the liar's push
/// at a made-up term and epoch is refused, and the real leader's is taken though the agent never heartbeats to it.
/// Before, the agent took the liar's word from its heartbeat answer, and the forged epoch 2^40 froze the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_lies_to_an_agent_about_who_leads_moves_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let pki = tempfile::tempdir().unwrap();
    let dir = pki.path().to_string_lossy().into_owned();
    let (ok, _, err) = cli(&["certs", "init", "--out", &dir, "--nodes", "3", "--agent", "node-0", "--agent", "lied-0"]);
    assert!(ok, "{err}");
    let c = Cluster::start_tls(3, &[], pki.path());
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    // A node the cluster plans for, so that plans are committed.
    let planned =
        start_sim_tls(&c.endpoints(), 1, 1, tessera_sim::node::ClockKind::Wall, "node", Some(pki.path())).await;
    let liar_id = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();
    let mut operator = CoordinatorApiClient::new(c.channel_as(leader, Some(&tls_files(pki.path(), "operator"))));
    // A committed plan, so that the leader has an epoch to push.
    eventually(T, "a plan to be committed", || {
        let mut operator = operator.clone();
        async move {
            let spec = tenant("t1", "resnet50", 1.0);
            operator.create_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await.ok();
            operator.trigger_plan(v1::TriggerPlanRequest {}).await.ok()?;
            let s = operator.cluster_status(v1::ClusterStatusRequest {}).await.ok()?.into_inner();
            (s.plan_epoch > 0 && s.leader_id == leader).then_some(())
        }
    })
    .await;
    let status = operator.cluster_status(v1::ClusterStatusRequest {}).await.unwrap().into_inner();

    /// The compromised member: it says it leads, 50 terms on, with epoch 2^40 committed.
    #[derive(Clone)]
    struct Liar {
        lie: v1::Leadership,
        heard: Arc<AtomicU64>,
    }
    #[tonic::async_trait]
    impl v1::coordinator_server::Coordinator for Liar {
        async fn register(
            &self,
            _: tonic::Request<v1::RegisterRequest>,
        ) -> Result<tonic::Response<v1::RegisterResponse>, tonic::Status> {
            self.heard.fetch_add(1, Ordering::SeqCst);
            Ok(tonic::Response::new(v1::RegisterResponse {
                heartbeat_interval_ms: 0,
                leadership: Some(self.lie.clone()),
            }))
        }
        async fn heartbeat(
            &self,
            _: tonic::Request<v1::HeartbeatRequest>,
        ) -> Result<tonic::Response<v1::HeartbeatResponse>, tonic::Status> {
            self.heard.fetch_add(1, Ordering::SeqCst);
            Ok(tonic::Response::new(v1::HeartbeatResponse { registered: true, leadership: Some(self.lie.clone()) }))
        }
        async fn get_leadership(
            &self,
            _: tonic::Request<v1::LeadershipRequest>,
        ) -> Result<tonic::Response<v1::Leadership>, tonic::Status> {
            Ok(tonic::Response::new(self.lie.clone()))
        }
    }
    let lie = v1::Leadership { leader_id: liar_id, term: status.term + 50, plan_epoch: 1 << 40, revocations: None };
    let liar = Liar { lie: lie.clone(), heard: Arc::default() };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let liar_addr = listener.local_addr().unwrap();
    let tls = tessera_auth::ServerTls::new(tls_files(pki.path(), &format!("node-{liar_id}"))).unwrap();
    let served = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::coordinator_server::CoordinatorServer::new(liar.clone()))
            .serve_with_incoming(tessera_auth::incoming(listener, tls)),
    );
    // The agent's first address is the liar's: every register and heartbeat goes to it.
    let endpoints = format!("{liar_addr},{}", c.endpoints());
    let sim = start_sim_tls(&endpoints, 1, 1, tessera_sim::node::ClockKind::Wall, "lied", Some(pki.path())).await;
    eventually(T, "the agent to heartbeat to the liar", || async {
        (liar.heard.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    let push_as = |member: u64| {
        let f = tls_files(pki.path(), &format!("node-{member}"));
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", sim.addr(0)))
            .unwrap()
            .tls_config(f.client("lied-0").unwrap())
            .unwrap()
            .connect_lazy();
        v1::agent_client::AgentClient::new(channel)
    };
    let forged = v1::ApplyLayoutRequest { epoch: lie.plan_epoch, targets: vec![], term: lie.term, jobs: vec![] };
    let e = push_as(liar_id).apply_layout(forged).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("beyond the known term"), "{e:?}");
    // The real leader, at its term, with the epoch it committed: taken.
    let real = v1::ApplyLayoutRequest { epoch: status.plan_epoch, targets: vec![], term: status.term, jobs: vec![] };
    let r = push_as(leader).apply_layout(real).await.unwrap().into_inner();
    assert_eq!(r.status(), v1::ApplyStatus::Accepted, "{r:?}");
    assert_eq!(r.epoch, status.plan_epoch);
    served.abort();
    sim.stop().await;
    planned.stop().await;
}

/// Bodies sent all but their last bytes and then held, on raw HTTP/2 streams (the report's attack: 256 x 1 MiB per
/// connection on the API and 4 x 200 MiB on the Raft path, pinned for as long as the sender liked): every unary
/// call is ended at the call deadline (`--call-deadline`, 1 s here) with `DEADLINE_EXCEEDED`, which drops what was
/// sent, and the member keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_bodies_are_dropped_at_the_call_deadline() {
    let pki = tempfile::tempdir().unwrap();
    let dir = pki.path().to_string_lossy().into_owned();
    let (ok, _, err) = cli(&["certs", "init", "--out", &dir, "--nodes", "3"]);
    assert!(ok, "{err}");
    let c = Cluster::start_tls(3, &["--call-deadline", "1s"], pki.path());
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let api_max = tessera_coordinator::server::MAX_API_REQUEST_BYTES;
    let raft_max = tessera_coordinator::transport::MAX_MESSAGE_BYTES;
    for (who, path, declared) in [
        ("reader", "/tessera.v1.CoordinatorApi/ListTenants", api_max - 16),
        ("node-2", "/tessera.v1.Raft/Step", raft_max - 16),
    ] {
        let files = tls_files(pki.path(), who);
        let tls = tls_connect(&c.addr(leader), &files).await.expect("a TLS connection");
        let (h2, connection) = h2::client::handshake(tls).await.unwrap();
        let driven = tokio::spawn(connection);
        let mut h2 = h2.ready().await.unwrap();
        let mut held = Vec::new();
        for _ in 0..16 {
            let request = http::Request::post(format!("https://{}{path}", tessera_auth::COORDINATOR_SERVER_NAME))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .unwrap();
            let (response, mut body) = h2.send_request(request, false).unwrap();
            // A gRPC frame that announces `declared` bytes, and 1 KiB of them.
            let mut frame = vec![0u8];
            frame.extend(u32::try_from(declared).unwrap().to_be_bytes());
            frame.extend(vec![0u8; 1024]);
            body.send_data(frame.into(), false).unwrap();
            held.push((response, body));
            h2 = h2.ready().await.unwrap();
        }
        for (response, _body) in held {
            // The bound only keeps a broken server from hanging the test.
            let answer = tokio::time::timeout(T, response).await.expect("an answer").expect("a response");
            let status = answer.headers().get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_string);
            assert_eq!(status.as_deref(), Some("4"), "{who} {path}: DEADLINE_EXCEEDED: {answer:?}");
        }
        driven.abort();
    }
    let mut reader = CoordinatorApiClient::new(c.channel_as(leader, Some(&tls_files(pki.path(), "reader"))));
    reader.list_tenants(v1::ListRequest { stale: false }).await.expect("the member still answers");
}
