//! Codec throughput figures (not a timed test): GB/s of BF16 input for the
//! reference and fast encoders of Q3_PLE_32 and NVFP4, on one thread and on
//! all threads, plus decode throughput. Each figure is printed as
//! `wall-clock [per CPU-second]` (the second divides by the CPU time the
//! process's threads actually got, a per-core rate that survives a loaded
//! machine), with the load average at start and end. Run with
//! `cargo bench -p ftpipe-formats`; figures go in docs/performance.md.

// Dev-dependencies are shared by every test and bench target of a package, so
// an unused one here is not a finding; the lint stays on for libraries and binaries.
#![allow(unused_crate_dependencies)]

use std::time::Instant;

use ftpipe_formats::{Q3GlobalScale, nvfp4, q3};
use half::bf16;

const FAST_BYTES: usize = 2 * 160 * 819_200; // 250 MiB of BF16, whole 160-wide rows
const REF_BYTES: usize = 2 * 160 * 102_400; // reference encoders are slow: a 31.25 MiB prefix

fn data(n: usize) -> Vec<bf16> {
    // Deterministic pseudo-normal weights (sum of uniforms), scale ~0.02.
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            let mut acc = 0.0f32;
            for _ in 0..4 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                acc += (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
            bf16::from_f32(acc * 0.03)
        })
        .collect()
}

/// CPU time consumed so far by all live threads of this process, in ns
/// (Linux `/proc/self/task/*/schedstat`; 0 where unavailable).
fn cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Throughput of `f` over `bytes` of input, best of `reps` runs.
#[derive(Clone, Copy)]
struct Rate {
    /// GB/s by wall-clock time.
    wall: f64,
    /// GB per CPU-second (all threads' CPU time summed): per-core rate,
    /// insensitive to time spent waiting for a core on a loaded machine.
    cpu: f64,
}

fn gbps(bytes: usize, reps: usize, mut f: impl FnMut()) -> Rate {
    let (mut wall, mut cpu) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        let (t, c) = (Instant::now(), cpu_ns());
        f();
        wall = wall.min(t.elapsed().as_secs_f64());
        cpu = cpu.min((cpu_ns() - c) as f64 / 1e9);
    }
    Rate {
        wall: bytes as f64 / wall / 1e9,
        cpu: bytes as f64 / cpu / 1e9,
    }
}

/// The 1/5/15-minute load averages (Linux), for the record.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn one_thread<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(f)
}

/// One codec's figures.
#[derive(Clone, Copy)]
struct Figures {
    /// Reference encoder, 1 thread.
    reference: Rate,
    /// Fast encoder, 1 thread.
    fast_one: Rate,
    /// Fast encoder, all threads.
    fast_all: Rate,
    /// Decoder.
    decode: Rate,
}

/// Rates of a `reference` encoder (over [`REF_BYTES`], best of 2) and a
/// `fast` one (over [`FAST_BYTES`], best of 3, on one thread then on all):
/// `(reference, fast on 1 thread, fast on all)`.
fn encoder_rates(mut reference: impl FnMut(), mut fast: impl FnMut() + Send) -> (Rate, Rate, Rate) {
    let r = gbps(REF_BYTES, 2, &mut reference);
    let f1 = one_thread(|| gbps(FAST_BYTES, 3, &mut fast));
    let fall = gbps(FAST_BYTES, 3, &mut fast);
    (r, f1, fall)
}

/// Q3_PLE_32 from BF16 `x` and from f32, the fast encoders checked
/// against the reference ones over `xr`; both rows show the decoder's rate.
fn bench_q3(x: &[bf16], xr: &[bf16]) -> [Figures; 2] {
    let width = 160;
    let g = Q3GlobalScale::from_absmax(q3::table_absmax("bench", x, 0).unwrap()).unwrap();
    let mut out = vec![0u8; x.len() / 32 * 14];
    let mut out_r = vec![0u8; xr.len() / 32 * 14];
    let (q_ref, q_f1, q_fn) = encoder_rates(
        || {
            q3::encode_ref("b", xr, width, g, 0, &mut out_r).unwrap();
        },
        || {
            q3::encode("b", x, width, g, 0, &mut out).unwrap();
        },
    );
    assert_eq!(&out[..out_r.len()], &out_r[..], "Q3 fast != reference");
    let (qf_ref, qf_f1, qf_fn) = bench_q3_f32(x, xr.len(), width, &mut out_r, out.len());
    let mut y = vec![0f32; x.len()];
    let q_dec = gbps(FAST_BYTES, 3, || q3::decode(&out, g, &mut y).unwrap());
    [
        Figures {
            reference: q_ref,
            fast_one: q_f1,
            fast_all: q_fn,
            decode: q_dec,
        },
        Figures {
            reference: qf_ref,
            fast_one: qf_f1,
            fast_all: qf_fn,
            decode: q_dec,
        },
    ]
}

/// Q3 from f32 (a table decoded from FP8 × scale): values off the BF16
/// grid, rated per element as 2 bytes like the BF16 rows. The reference
/// encodes the first `ref_len` elements into `out_r`; the fast encoder's
/// output (`out_len` bytes) is checked against it.
fn bench_q3_f32(
    x: &[bf16],
    ref_len: usize,
    width: usize,
    out_r: &mut [u8],
    out_len: usize,
) -> (Rate, Rate, Rate) {
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32() * 1.1).collect();
    let xfr = &xf[..ref_len];
    let gf = Q3GlobalScale::from_absmax(q3::table_absmax_f32("bench", &xf, 0).unwrap()).unwrap();
    let mut outf = vec![0u8; out_len];
    let rates = encoder_rates(
        || {
            q3::encode_ref_f32("b", xfr, width, gf, 0, &mut *out_r).unwrap();
        },
        || {
            q3::encode_f32("b", &xf, width, gf, 0, &mut outf).unwrap();
        },
    );
    assert_eq!(&outf[..out_r.len()], &out_r[..], "Q3 f32 fast != reference");
    rates
}

/// NVFP4 (per-tensor scale, so the reference prefix `xr` is its own
/// tensor), the fast encoder checked against the reference.
fn bench_nvfp4(x: &[bf16], xr: &[bf16]) -> Figures {
    let mut nv = vec![0u8; nvfp4::nvfp4_len(x.len() as u64).unwrap() as usize];
    let mut nv_r = vec![0u8; nvfp4::nvfp4_len(xr.len() as u64).unwrap() as usize];
    let mut nv_r2 = nv_r.clone();
    let (n_ref, n_f1, n_fn) = encoder_rates(
        || {
            nvfp4::encode_ref("b", xr, &mut nv_r).unwrap();
        },
        || nvfp4::encode("b", x, &mut nv).unwrap(),
    );
    nvfp4::encode("b", xr, &mut nv_r2).unwrap();
    assert_eq!(nv_r, nv_r2, "NVFP4 fast != reference");
    let mut y = vec![0f32; x.len()];
    let n_dec = gbps(FAST_BYTES, 3, || nvfp4::decode(&nv, &mut y).unwrap());
    Figures {
        reference: n_ref,
        fast_one: n_f1,
        fast_all: n_fn,
        decode: n_dec,
    }
}

/// Prints the table of `rows` (codec name, figures) measured with
/// `threads` threads.
fn print_table(threads: usize, rows: [(&str, Figures); 3]) {
    println!("wall-clock GB/s of BF16 input (in brackets: GB per CPU-second, i.e. per busy core)");
    println!(
        "| codec | reference, 1 thread | fast, 1 thread | fast, {threads} threads | fast/ref (1 thread, wall) | decode, 1 thread |"
    );
    println!("|---|---|---|---|---|---|");
    let f = |r: Rate| format!("{:.3} [{:.3}]", r.wall, r.cpu);
    for (name, r) in rows {
        println!(
            "| {name} | {} | {} | {} | {:.1}x | {} |",
            f(r.reference),
            f(r.fast_one),
            f(r.fast_all),
            r.fast_one.wall / r.reference.wall,
            f(r.decode)
        );
    }
}

/// Prints the fixed per-call cost of the fast NVFP4 encoder (its
/// per-tensor boundary table), visible on small tensors: a 16 Ki-element
/// prefix of `x`, best of 20.
fn print_small_nvfp4(x: &[bf16]) {
    let small = &x[..16 * 1024];
    let mut nv_s = vec![0u8; nvfp4::nvfp4_len(small.len() as u64).unwrap() as usize];
    let t_small = one_thread(|| {
        (0..20)
            .map(|_| {
                let t = Instant::now();
                nvfp4::encode("b", small, &mut nv_s).unwrap();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    });
    println!(
        "NVFP4 fast encode of a 16 Ki-element tensor, 1 thread: {:.0} us",
        t_small * 1e6
    );
}

fn main() {
    let threads = rayon::current_num_threads();
    let x = data(FAST_BYTES / 2);
    let xr = &x[..REF_BYTES / 2];
    println!(
        "codec bench: {:.2} MiB BF16 (reference: first {:.2} MiB), {threads} threads, load average at start {}",
        FAST_BYTES as f64 / 1048576.0,
        REF_BYTES as f64 / 1048576.0,
        load()
    );
    let [q3_bf16, q3_f32] = bench_q3(&x, xr);
    let nvfp4_figures = bench_nvfp4(&x, xr);
    print_table(
        threads,
        [
            ("Q3_PLE_32", q3_bf16),
            ("Q3_PLE_32 from f32", q3_f32),
            ("NVFP4", nvfp4_figures),
        ],
    );
    print_small_nvfp4(&x);
    println!("load average at end {}", load());
}
