//! Stand-ins for what no test machine runs: the Kubernetes API server (`kube_double`) and a
//! node's kubelet (`kubelet_double`, with its fast path for the soak). What they stand in for
//! and where they differ is in docs/kubernetes.md.

#[allow(dead_code)]
pub mod kube_double;
#[allow(dead_code)]
pub mod kubelet_double;
