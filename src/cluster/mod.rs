//! The cluster lease (issue 14, feature `etcd`): the same lifecycle with the lease and CURRENT
//! on etcd, fenced by revision. See spec/cluster.md.

pub mod etcd;
pub mod http;
