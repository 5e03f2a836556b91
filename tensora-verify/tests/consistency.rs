//! Invariant: the integrity scan, the fused load digests and a plain one-shot digest of each
//! tensor's bytes agree, for any layout, chunk size and budget; crc32c needs no second pass.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tensora_format::Dtype;
use tensora_format::write::{SafetensorsLayout, ShardedLayout, TensorSpec, write_safetensors, write_sharded};
use tensora_io::LoadOptions;
use tensora_verify::Algo;
use tensora_verify::{DigestCollector, hash_with_load};
use tensora_verify::{ScanConfig, scan};

fn specs() -> impl Strategy<Value = Vec<TensorSpec>> {
    let dtype = prop::sample::select(vec![Dtype::U8, Dtype::F16, Dtype::BF16, Dtype::F32, Dtype::I64]);
    let shape = prop::collection::vec(0u64..24, 0..4);
    prop::collection::vec((dtype, shape), 1..12).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (dtype, shape))| TensorSpec { name: format!("layer.{i}.w"), dtype, shape })
            .collect()
    })
}

/// Deterministic bytes for tensor `i`.
fn fill(i: usize, out: &mut dyn std::io::Write, nbytes: u64) -> std::io::Result<()> {
    let bytes: Vec<u8> = (0..nbytes).map(|k| (k as u8).wrapping_mul(31).wrapping_add(i as u8 * 17)).collect();
    out.write_all(&bytes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn scan_fused_and_one_shot_digests_agree(
        specs in specs(),
        algo_i in 0usize..3,
        chunk_bytes in 1usize..5000,
        budget_kib in 1u64..64,
        sharded in any::<bool>(),
        segment_bytes in 1u64..4096,
    ) {
        let algo = Algo::ALL[algo_i];
        let dir = tempfile::tempdir().unwrap();
        let sizes: Vec<u64> = specs.iter().map(|s| s.nbytes().unwrap()).collect();
        let path = if sharded {
            let layout = ShardedLayout::new(specs.clone(), BTreeMap::new(), 512).unwrap();
            write_sharded(dir.path(), &layout, |i, out| fill(i, out, sizes[i])).unwrap();
            dir.path().to_path_buf()
        } else {
            let layout = SafetensorsLayout::new(specs.clone(), BTreeMap::new()).unwrap();
            let p = dir.path().join("m.safetensors");
            write_safetensors(&p, &layout, |i, out| fill(i, out, sizes[i])).unwrap();
            p
        };
        let ckpt = tensora_format::open(&path).unwrap();

        let config = ScanConfig { algo, chunk_bytes, threads: 2, segment_bytes, retries_max: 0 };
        let scanned = scan(&ckpt, &config);
        prop_assert!(scanned.is_clean(), "{:?}", scanned.files);
        // The segments tile every file: each byte read exactly once.
        for f in &scanned.files {
            prop_assert_eq!(f.read_bytes, f.expected_len_bytes);
        }

        let opts = LoadOptions { budget_bytes: budget_kib << 10, chunk_bytes: 4096, ..LoadOptions::default() };
        let (fused, _) = hash_with_load(&ckpt, algo, &opts).unwrap();
        // The same load with the collector's hooks: crc32c digests come from the pieces alone.
        let collector = DigestCollector::new(&ckpt, algo);
        let mut piece_opts = opts.clone();
        collector.install(&mut piece_opts);
        tensora_io::load_streaming(&ckpt, &piece_opts, |_| Ok(())).unwrap();
        prop_assert_eq!(collector.finish(&ckpt).unwrap(), fused.clone());
        let total_bytes: u64 = ckpt.tensors().iter().map(|t| t.nbytes()).sum();
        let stats = collector.stats();
        prop_assert_eq!(stats.bytes_on_arrival + stats.bytes_at_completion, total_bytes);
        if algo == Algo::Crc32c {
            prop_assert_eq!(stats.bytes_at_completion, 0);
        }

        for (i, t) in ckpt.tensors().iter().enumerate() {
            let spec_i = specs.iter().position(|s| s.name == t.name()).unwrap();
            let mut expected = Vec::new();
            fill(spec_i, &mut expected, sizes[spec_i]).unwrap();
            let one_shot = algo.digest(&expected);
            prop_assert_eq!(scanned.digests[i], Some(one_shot), "{}", t.name());
            prop_assert_eq!(fused[i], one_shot, "{}", t.name());
        }
    }
}
