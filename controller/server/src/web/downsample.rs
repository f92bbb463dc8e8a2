//! Long series cut to what a plot can show, by one stated rule: the time
//! span is divided into `buckets` equal intervals, and each interval keeps
//! the points that are the lowest and the highest of any of the given
//! values (a clock's offset, and the edges of its uncertainty band), in
//! time order. A spike is therefore never dropped, however long the
//! series; a series already short enough is kept whole.

/// The indices of the points of `xs` (ascending times) to keep, given the
/// values `ys` (each as long as `xs`) and at most `buckets` intervals.
/// At most `2 * ys.len() * buckets` indices, ascending.
pub fn keep(xs: &[i64], ys: &[&[f64]], buckets: usize) -> Vec<usize> {
    let n = xs.len();
    if n <= buckets.max(1) * 2 || buckets == 0 {
        return (0..n).collect();
    }
    let (first, last) = (xs[0], xs[n - 1]);
    let span = i128::from(last) - i128::from(first) + 1;
    let bucket_of = |x: i64| -> usize {
        let off = i128::from(x) - i128::from(first);
        usize::try_from(off * buckets as i128 / span).unwrap_or(buckets - 1)
    };
    let mut out = Vec::with_capacity(buckets * 2 * ys.len().max(1));
    let mut start = 0;
    while start < n {
        let b = bucket_of(xs[start]);
        let mut end = start + 1;
        while end < n && bucket_of(xs[end]) == b {
            end += 1;
        }
        let mut picked: Vec<usize> = Vec::with_capacity(2 * ys.len());
        if ys.is_empty() {
            picked.push(start);
        }
        for y in ys {
            let range = start..end;
            let lo = range
                .clone()
                .min_by(|&a, &b| y[a].total_cmp(&y[b]))
                .unwrap_or(start);
            let hi = range
                .max_by(|&a, &b| y[a].total_cmp(&y[b]))
                .unwrap_or(start);
            picked.push(lo);
            picked.push(hi);
        }
        picked.sort_unstable();
        picked.dedup();
        out.extend(picked);
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::keep;
    use proptest::prelude::*;

    #[test]
    fn a_short_series_is_kept_whole() {
        let xs = [1, 2, 3];
        assert_eq!(keep(&xs, &[&[0.0, 1.0, 2.0]], 10), vec![0, 1, 2]);
    }

    proptest! {
        /// However long the series, every bucket's extremes survive, the
        /// output is bounded and in time order.
        #[test]
        fn the_extremes_are_never_dropped(
            ys in proptest::collection::vec(-1.0e9f64..1.0e9, 1..3000),
            gaps in proptest::collection::vec(1i64..1_000_000, 3000),
            buckets in 1usize..300,
        ) {
            let mut x = 0i64;
            let xs: Vec<i64> = ys.iter().zip(&gaps).map(|(_, g)| { x += g; x }).collect();
            let band: Vec<f64> = ys.iter().map(|y| y + 5.0).collect();
            let kept = keep(&xs, &[&ys, &band], buckets);
            prop_assert!(kept.windows(2).all(|w| w[0] < w[1]));
            if xs.len() > buckets * 2 {
                prop_assert!(kept.len() <= 4 * buckets);
            }
            let max = ys.iter().cloned().fold(f64::MIN, f64::max);
            let min = ys.iter().cloned().fold(f64::MAX, f64::min);
            prop_assert!(kept.iter().any(|&i| ys[i] == max));
            prop_assert!(kept.iter().any(|&i| ys[i] == min));
        }
    }
}
