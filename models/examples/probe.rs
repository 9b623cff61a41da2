use stateright::Representative;
use tenure_models::lease::{LeaseModel, LeaseState};
use tenure_models::run::{check, Search};
fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|x| x.parse().unwrap()).collect();
    let mut m = LeaseModel::ci(a[0]);
    m.atomic_steps = a[1] == 1; m.timers = a[2] == 1; m.recovery_failures = a[3] == 1;
    let sym = a[4] == 1;
    let r = if sym { check(m, Search::DfsSymmetry, 1, Some(<LeaseState as Representative>::representative), None) } else { check(m, Search::Bfs, 1, None, None) };
    print!("{}", r.to_string().lines().next().unwrap()); println!(" all hold {}", r.all_hold());
}
