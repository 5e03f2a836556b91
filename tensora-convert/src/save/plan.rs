//! Output files as byte plans, and their cut into pieces.
//!
//! A [`FilePlan`] says what every byte of one output file is: the header (written last) and
//! regions of tensor bytes or zeros that tile the rest. The writer cuts each file into pieces at
//! multiples of [`ALIGN_BYTES`]: the *head* (the header and the data up to the first aligned
//! boundary) and data pieces of at most the piece size after it, so every piece but a file's last
//! starts and ends aligned, as `O_DIRECT` needs.

use std::path::PathBuf;

use tensora_format::sllm::write::SllmLayout;
use tensora_format::write::SafetensorsLayout;

/// Alignment of every piece's offset and length (`O_DIRECT` needs the logical block size; 4 KiB
/// covers every disk in use).
pub const ALIGN_BYTES: u64 = 4096;

/// What a region of a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Content {
    /// Tensor `tensor`'s row-major bytes from `from_bytes` (safetensors).
    Dense { tensor: usize, from_bytes: u64 },
    /// Tensor `tensor`'s storage bytes from `from_bytes` (a ServerlessLLM record).
    Storage { tensor: usize, from_bytes: u64 },
    /// Zero bytes (ServerlessLLM record padding).
    Zeros,
}

/// A run of a file's bytes with one content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) offset_bytes: u64,
    pub(crate) len_bytes: u64,
    pub(crate) content: Content,
    /// Tensors whose digests cover these bytes (from the content's offset): the tensor itself, and
    /// for a ServerlessLLM record every tensor tied to it.
    pub(crate) digest_as: Vec<usize>,
}

impl Region {
    fn end_bytes(&self) -> u64 {
        self.offset_bytes + self.len_bytes
    }

    /// The content of this region's bytes from file offset `at` on.
    pub(crate) fn content_at(&self, at: u64) -> Content {
        let skip = at - self.offset_bytes;
        match self.content {
            Content::Dense { tensor, from_bytes } => Content::Dense { tensor, from_bytes: from_bytes + skip },
            Content::Storage { tensor, from_bytes } => {
                Content::Storage { tensor, from_bytes: from_bytes + skip }
            }
            Content::Zeros => Content::Zeros,
        }
    }
}

/// One output file.
#[derive(Debug, Clone)]
pub(crate) struct FilePlan {
    /// Where it ends up.
    pub(crate) path: PathBuf,
    /// Bytes at offset 0, written after everything else (empty for ServerlessLLM partitions).
    pub(crate) header: Vec<u8>,
    /// Sorted, tiling `header.len() .. len_bytes` exactly.
    pub(crate) regions: Vec<Region>,
    pub(crate) len_bytes: u64,
}

/// A byte range of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) file: usize,
    pub(crate) start_bytes: u64,
    pub(crate) end_bytes: u64,
}

impl Piece {
    pub(crate) fn len_bytes(&self) -> u64 {
        self.end_bytes - self.start_bytes
    }
}

impl FilePlan {
    /// A safetensors file: its header, then each tensor's row-major bytes where the layout puts
    /// them; layout spec `j` is source tensor `tensor_of[j]`.
    pub(crate) fn safetensors(path: PathBuf, layout: &SafetensorsLayout, tensor_of: &[usize]) -> FilePlan {
        let regions = layout
            .file_order()
            .iter()
            .map(|&j| (layout.tensor_range(j), tensor_of[j]))
            .filter(|(range, _)| range.end > range.start)
            .map(|(range, tensor)| Region {
                offset_bytes: range.start,
                len_bytes: range.end - range.start,
                content: Content::Dense { tensor, from_bytes: 0 },
                digest_as: vec![tensor],
            })
            .collect();
        FilePlan { path, header: layout.header_bytes().to_vec(), regions, len_bytes: layout.file_len_bytes() }
    }

    /// The partitions of a ServerlessLLM layout (spec `i` is source tensor `i`): each record's
    /// storage then its zero padding. `path_of(p)` names partition `p`.
    pub(crate) fn sllm(layout: &SllmLayout, path_of: impl Fn(u32) -> PathBuf) -> Vec<FilePlan> {
        let mut tied: Vec<Vec<usize>> = vec![Vec::new(); layout.specs().len()];
        for (i, s) in layout.specs().iter().enumerate() {
            if let Some(t) = s.tied_to {
                tied[t].push(i);
            }
        }
        let mut plans: Vec<FilePlan> = layout
            .partition_lens_bytes()
            .iter()
            .enumerate()
            .map(|(p, &len_bytes)| FilePlan {
                path: path_of(p as u32),
                header: Vec::new(),
                regions: Vec::new(),
                len_bytes,
            })
            .collect();
        for rec in layout.records() {
            let plan = &mut plans[rec.partition as usize];
            let at = rec.offset_in_partition_bytes;
            if rec.size_bytes > 0 {
                let mut digest_as = vec![rec.spec];
                digest_as.extend(&tied[rec.spec]);
                plan.regions.push(Region {
                    offset_bytes: at,
                    len_bytes: rec.size_bytes,
                    content: Content::Storage { tensor: rec.spec, from_bytes: 0 },
                    digest_as,
                });
            }
            if rec.padding_bytes > 0 {
                plan.regions.push(Region {
                    offset_bytes: at + rec.size_bytes,
                    len_bytes: rec.padding_bytes,
                    content: Content::Zeros,
                    digest_as: Vec::new(),
                });
            }
        }
        plans
    }

    /// Where the head ends: the header rounded up to [`ALIGN_BYTES`] (the whole file when
    /// shorter), or 0 without a header.
    pub(crate) fn head_end_bytes(&self) -> u64 {
        if self.header.is_empty() {
            return 0;
        }
        (self.header.len() as u64).next_multiple_of(ALIGN_BYTES).min(self.len_bytes)
    }

    /// How many data pieces of at most `piece_bytes` (a multiple of [`ALIGN_BYTES`]) follow the
    /// head.
    pub(crate) fn data_piece_count(&self, piece_bytes: u64) -> u64 {
        (self.len_bytes - self.head_end_bytes()).div_ceil(piece_bytes)
    }

    /// Data piece `k` of this file (`file` is its index among the outputs).
    pub(crate) fn data_piece(&self, file: usize, k: u64, piece_bytes: u64) -> Piece {
        let start_bytes = self.head_end_bytes() + k * piece_bytes;
        Piece { file, start_bytes, end_bytes: (start_bytes + piece_bytes).min(self.len_bytes) }
    }

    /// The data pieces after the head, in file order.
    #[cfg(test)]
    pub(crate) fn data_pieces(&self, file: usize, piece_bytes: u64) -> impl Iterator<Item = Piece> + '_ {
        (0..self.data_piece_count(piece_bytes)).map(move |k| self.data_piece(file, k, piece_bytes))
    }

    /// The regions overlapping `start .. end`, in order.
    pub(crate) fn regions_in(&self, start: u64, end: u64) -> impl Iterator<Item = &Region> {
        let first = self.regions.partition_point(|r| r.end_bytes() <= start);
        self.regions[first..].iter().take_while(move |r| r.offset_bytes < end)
    }

    /// Tensor bytes in the file (padding and header excluded): what progress counts.
    pub(crate) fn tensor_bytes(&self) -> u64 {
        self.regions.iter().filter(|r| r.content != Content::Zeros).map(|r| r.len_bytes).sum()
    }

    /// Tensor bytes between file offsets `start .. end`.
    pub(crate) fn tensor_bytes_in(&self, start: u64, end: u64) -> u64 {
        self.regions_in(start, end)
            .filter(|r| r.content != Content::Zeros)
            .map(|r| r.end_bytes().min(end) - r.offset_bytes.max(start))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tensora_format::Dtype;
    use tensora_format::sllm::write::{SllmLayoutConfig, SllmTensorSpec};
    use tensora_format::write::TensorSpec;

    #[test]
    fn pieces_are_aligned_and_tile_the_file_after_the_head() {
        let specs = vec![
            TensorSpec { name: "a".into(), dtype: Dtype::U8, shape: vec![10_000] },
            TensorSpec { name: "b".into(), dtype: Dtype::F32, shape: vec![5_000] },
        ];
        let layout = SafetensorsLayout::new(specs, BTreeMap::new()).unwrap();
        let plan = FilePlan::safetensors("x".into(), &layout, &[7, 9]);
        assert_eq!(plan.head_end_bytes(), ALIGN_BYTES);
        let pieces: Vec<Piece> = plan.data_pieces(3, 2 * ALIGN_BYTES).collect();
        assert_eq!(pieces[0].start_bytes, ALIGN_BYTES);
        assert!(pieces.windows(2).all(|w| w[0].end_bytes == w[1].start_bytes));
        assert!(pieces.iter().all(|p| p.start_bytes % ALIGN_BYTES == 0 && p.file == 3));
        assert_eq!(pieces.last().unwrap().end_bytes, layout.file_len_bytes());
        // F32 comes first in the file, then U8; both tensors are found by their source index.
        let regions: Vec<&Region> = plan.regions_in(0, plan.len_bytes).collect();
        assert_eq!(regions.len(), 2);
        assert_eq!(regions[0].content, Content::Dense { tensor: 9, from_bytes: 0 });
        let inside =
            plan.regions_in(regions[1].offset_bytes + 5, regions[1].offset_bytes + 6).next().unwrap();
        assert_eq!(inside.content_at(inside.offset_bytes + 5), Content::Dense { tensor: 7, from_bytes: 5 });
        assert_eq!(plan.tensor_bytes(), 30_000);
        assert_eq!(
            plan.tensor_bytes_in(0, ALIGN_BYTES + 1),
            ALIGN_BYTES + 1 - layout.header_bytes().len() as u64
        );
    }

    #[test]
    fn sllm_partitions_hold_records_padding_and_tied_digests() {
        let mut tied = SllmTensorSpec::dense("tied", Dtype::U8, vec![3]).unwrap();
        tied.tied_to = Some(0);
        let specs = vec![
            SllmTensorSpec::dense("w", Dtype::U8, vec![3]).unwrap(),
            tied,
            SllmTensorSpec::dense("big", Dtype::U8, vec![20]).unwrap(),
        ];
        let layout = SllmLayout::new(specs, &SllmLayoutConfig { partition_bytes_max: 10 }).unwrap();
        let plans = FilePlan::sllm(&layout, |p| format!("p{p}").into());
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[0].head_end_bytes(), 0);
        assert_eq!(plans[0].regions[0].digest_as, [0, 1]);
        assert_eq!(plans[0].regions[1].content, Content::Zeros);
        assert_eq!((plans[0].regions[1].offset_bytes, plans[0].regions[1].len_bytes), (3, 5));
        assert_eq!(plans[1].regions[0].content, Content::Storage { tensor: 2, from_bytes: 0 });
        let pieces: Vec<Piece> = plans[1].data_pieces(1, ALIGN_BYTES).collect();
        assert_eq!(pieces, [Piece { file: 1, start_bytes: 0, end_bytes: 24 }]);
    }
}
