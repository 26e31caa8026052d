//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several controller replicas
//! exactly one acts. The rules follow Kubernetes' own elector: a candidate takes the lease when
//! it has no holder or when its record has not changed for a whole lease duration *as seen by the
//! candidate's own clock* (so clock skew between nodes does not matter); every write is a
//! replace carrying the read `resourceVersion`, so of two candidates racing for it one gets a 409
//! and stays a follower. The holder renews every retry period and steps down when it could not
//! renew within the renew deadline, which is shorter than the lease duration: it stops acting
//! before anyone else may start.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

/// How the lease is held.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// Name of the Lease object.
    pub name: String,
    /// How long a silent holder keeps the lease before others may take it.
    pub duration: Duration,
    /// How long the holder keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the holder renews and candidates retry.
    pub retry_every: Duration,
}

/// What a candidate should do about the lease it observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Nobody holds it, or its holder went silent for a whole duration: take it.
    Take,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it.
    Wait { holder: String },
}

/// Decides from the observed lease and how long its record has stayed unchanged (by our clock).
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Claim {
    let Some(spec) = spec else { return Claim::Take };
    match spec.holder_identity.as_deref() {
        None | Some("") => Claim::Take,
        Some(holder) if holder == identity => Claim::Renew,
        Some(holder) => {
            let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0));
            if unchanged_for >= duration { Claim::Take } else { Claim::Wait { holder: holder.to_string() } }
        }
    }
}

/// The lease after a successful claim.
pub fn claimed(previous: Option<&LeaseSpec>, claim: &Claim, identity: &str, duration: Duration) -> LeaseSpec {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let previous = previous.cloned().unwrap_or_default();
    let seconds = i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX);
    match claim {
        Claim::Renew => LeaseSpec { renew_time: Some(now), lease_duration_seconds: Some(seconds), ..previous },
        _ => LeaseSpec {
            holder_identity: Some(identity.to_string()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_duration_seconds: Some(seconds),
            lease_transitions: Some(
                previous.lease_transitions.unwrap_or(0) + i32::from(previous.holder_identity.is_some()),
            ),
            ..previous
        },
    }
}

/// One candidate for the lease.
pub struct Elector {
    api: Api<Lease>,
    identity: String,
    settings: LeaseSettings,
    /// The last record seen and when (our clock) it was first seen.
    observed: std::sync::Mutex<Option<(LeaseSpec, Instant)>>,
}

impl Elector {
    pub fn new(client: kube::Client, namespace: &str, identity: String, settings: LeaseSettings) -> Elector {
        Elector { api: Api::namespaced(client, namespace), identity, settings, observed: Default::default() }
    }

    /// How long the lease's record has stayed as it is now.
    fn observe(&self, spec: &LeaseSpec) -> Duration {
        let mut observed = self.observed.lock().unwrap_or_else(|poison| poison.into_inner());
        match observed.as_ref() {
            Some((seen, since)) if seen == spec => since.elapsed(),
            _ => {
                *observed = Some((spec.clone(), Instant::now()));
                Duration::ZERO
            }
        }
    }

    /// One attempt to take or renew the lease: true when we hold it afterwards.
    pub async fn try_claim(&self) -> Result<bool, kube::Error> {
        let conflict = |error: &kube::Error| matches!(error, kube::Error::Api(status) if status.code == 409);
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.settings.name.clone()), ..Default::default() },
                spec: Some(claimed(None, &Claim::Take, &self.identity, self.settings.duration)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(error) if conflict(&error) => Ok(false),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let claim = decide(Some(&spec), &self.identity, self.observe(&spec));
        if let Claim::Wait { .. } = claim {
            return Ok(false);
        }
        lease.spec = Some(claimed(Some(&spec), &claim, &self.identity, self.settings.duration));
        // The read resourceVersion travels with the object: a concurrent writer makes this a 409.
        match self.api.replace(&self.settings.name, &PostParams::default(), &lease).await {
            Ok(written) => {
                if let Some(spec) = written.spec {
                    self.observe(&spec);
                }
                if claim == Claim::Take {
                    tracing::info!(identity = %self.identity, lease = %self.settings.name, "became the leader");
                }
                Ok(true)
            }
            Err(error) if conflict(&error) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Waits until this candidate holds the lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_claim().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(error) => tracing::warn!(error = &error as &dyn std::error::Error, "failed to claim the lease"),
            }
            tokio::time::sleep(self.settings.retry_every).await;
        }
    }

    /// Keeps renewing the lease; returns when it is lost (someone else holds it, or no renewal
    /// succeeded within the renew deadline).
    pub async fn hold(&self) {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.settings.retry_every).await;
            let left = self.settings.renew_deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, self.try_claim()).await {
                Ok(Ok(true)) => renewed = Instant::now(),
                Ok(Ok(false)) => {
                    tracing::warn!(identity = %self.identity, "the lease was taken by another controller");
                    return;
                }
                Ok(Err(error)) if renewed.elapsed() < self.settings.renew_deadline => {
                    tracing::warn!(error = &error as &dyn std::error::Error, "failed to renew the lease; retrying");
                }
                Ok(Err(_)) | Err(_) => {
                    tracing::warn!(identity = %self.identity, "could not renew the lease in time; stepping down");
                    return;
                }
            }
        }
    }

    /// Gives the lease up (on shutdown), so a follower takes over at once.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.settings.name).await else { return };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        if let Err(error) = self.api.replace(&self.settings.name, &PostParams::default(), &lease).await {
            tracing::warn!(error = &error as &dyn std::error::Error, "failed to release the lease");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(seconds),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_or_unheld_lease_is_taken() {
        assert_eq!(decide(None, "a", Duration::ZERO), Claim::Take);
        assert_eq!(decide(Some(&LeaseSpec::default()), "a", Duration::ZERO), Claim::Take);
        let released = LeaseSpec { holder_identity: Some(String::new()), ..held_by("b", 15) };
        assert_eq!(decide(Some(&released), "a", Duration::ZERO), Claim::Take);
    }

    #[test]
    fn our_own_lease_is_renewed() {
        assert_eq!(decide(Some(&held_by("a", 15)), "a", Duration::from_secs(100)), Claim::Renew);
    }

    #[test]
    fn another_holder_keeps_it_until_silent_for_a_whole_duration() {
        let lease = held_by("b", 15);
        assert_eq!(decide(Some(&lease), "a", Duration::from_secs(14)), Claim::Wait { holder: "b".into() });
        assert_eq!(decide(Some(&lease), "a", Duration::from_secs(15)), Claim::Take);
    }

    #[test]
    fn taking_counts_a_transition_and_renewing_keeps_the_acquire_time() {
        let lease = LeaseSpec { lease_transitions: Some(3), ..held_by("b", 15) };
        let taken = claimed(Some(&lease), &Claim::Take, "a", Duration::from_secs(10));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.lease_duration_seconds, Some(10));
        let first = claimed(None, &Claim::Take, "a", Duration::from_secs(10));
        assert_eq!(first.lease_transitions, Some(0));
        let renewed = claimed(Some(&taken), &Claim::Renew, "a", Duration::from_secs(10));
        assert_eq!(renewed.acquire_time, taken.acquire_time);
        assert_eq!(renewed.holder_identity.as_deref(), Some("a"));
        assert_eq!(renewed.lease_transitions, Some(4));
    }
}
