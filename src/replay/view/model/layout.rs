//! Rows: once every item is known, each lane gets the rows it uses, and waits are packed into as few rows as
//! their overlap allows.

use crate::HashMap;

use super::{Item, Kind, Lane};

/// Rows: every lane gets the rows it uses; waits are packed into as few rows as overlap allows.
pub(super) fn layout(items: &mut [Item], lanes: &mut [Lane], end: f64) {
    let mut wait_rows: HashMap<usize, Vec<f64>> = HashMap::default();
    let mut wait_row_of: HashMap<(usize, String), usize> = HashMap::default();
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| items[a].t.total_cmp(&items[b].t));
    let base = ["turns", "own", "compact", "events", "shim", "files"];
    for &it in &order {
        let item = &mut items[it];
        if item.end.is_none() && matches!(item.kind, Kind::Turn | Kind::Wait | Kind::Own | Kind::Permission) {
            item.open = true;
        }
        if item.kind == Kind::Compact && item.end.is_none() {
            item.open = true;
        }
        let name = match item.kind {
            Kind::Turn | Kind::Cancel => "turns",
            // Coda's request beside its turns; what the agent reported in a row of its own.
            Kind::Compact if item.method == "_coda/session/compact" => "turns",
            Kind::Compact => "compact",
            Kind::Own => "own",
            Kind::Shim => "shim",
            Kind::File => "files",
            Kind::Wait => {
                let rows = wait_rows.entry(item.lane).or_default();
                let last = item.end.unwrap_or(end);
                let r = match rows.iter().position(|&free| free < item.t) {
                    Some(r) => r,
                    None => {
                        rows.push(0.0);
                        rows.len() - 1
                    }
                };
                rows[r] = last;
                wait_row_of.insert((item.lane, item.wait.clone()), r);
                item.row = 100 + r;
                continue;
            }
            _ => "events",
        };
        item.row = base.iter().position(|b| *b == name).unwrap_or(3);
    }
    for item in items.iter_mut() {
        if item.kind == Kind::Stop
            && let Some(r) = wait_row_of.get(&(item.lane, item.wait.clone()))
        {
            item.row = 100 + r;
        }
    }
    let mut used: Vec<Vec<bool>> = vec![vec![false; base.len()]; lanes.len()];
    for item in items.iter() {
        if item.row < 100 {
            used[item.lane][item.row] = true;
        }
    }
    let mut index: Vec<Vec<usize>> = vec![Vec::new(); lanes.len()];
    for (l, lane) in lanes.iter_mut().enumerate() {
        for (r, name) in base.iter().enumerate() {
            index[l].push(lane.rows.len());
            if used[l][r] {
                lane.rows.push(name);
            }
        }
        let waits = wait_rows.get(&l).map_or(0, Vec::len);
        index[l].push(lane.rows.len());
        lane.rows.extend(std::iter::repeat_n("wait", waits));
    }
    for item in items.iter_mut() {
        item.row =
            if item.row >= 100 { index[item.lane][base.len()] + item.row - 100 } else { index[item.lane][item.row] };
    }
}
