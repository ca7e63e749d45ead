//! An LZ4 frame (the format xet-core's chunks are compressed in) decoded
//! straight into one buffer of the chunk's plain size: each block by
//! `lz4_flex::block` (a linked block with the bytes before it as its
//! dictionary). `lz4_flex::frame::FrameDecoder` zeroes a window buffer for
//! every frame and copies each block out of it; a xorb range is thousands
//! of one-block frames.
//!
//! Header, block and content checksums are not checked: the decoded
//! chunk's Xet hash is, and it covers every byte. Anything the frame says
//! that does not fit the plain size (a block past it, a content size that
//! disagrees, fewer bytes) is refused.

/// The LZ4 frame magic number.
const MAGIC: u32 = 0x184D_2204;
/// A linked block may refer this far back.
const WINDOW: usize = 64 * 1024;
/// The top bit of a block's size: stored uncompressed.
const UNCOMPRESSED: u32 = 1 << 31;

/// `body`, one LZ4 frame, decoded to exactly `plain` bytes.
pub(super) fn decode(body: &[u8], plain: usize) -> Result<Vec<u8>, String> {
    let mut at = Reader { body, at: 0 };
    if at.u32()? != MAGIC {
        return Err("not an LZ4 frame (magic)".into());
    }
    let flags = at.u8()?;
    let _block_max = at.u8()?;
    if flags >> 6 != 1 {
        return Err(format!(
            "LZ4 frame version {} (this client reads 1)",
            flags >> 6
        ));
    }
    let linked = flags & 0x20 == 0;
    let block_checksums = flags & 0x10 != 0;
    if flags & 0x08 != 0 {
        let size = at.u64()?;
        if size != plain as u64 {
            return Err(format!(
                "LZ4 frame content size {size}, the chunk's {plain}"
            ));
        }
    }
    if flags & 0x01 != 0 {
        at.skip(4)?; // dictionary id: no dictionary is known before the frame
    }
    at.skip(1)?; // header checksum
    let mut out = vec![0u8; plain];
    let mut filled = 0usize;
    loop {
        let size = at.u32()?;
        if size == 0 {
            break;
        }
        let block = at.take((size & !UNCOMPRESSED) as usize)?;
        let (before, rest) = out.split_at_mut(filled);
        let n = if size & UNCOMPRESSED != 0 {
            let to = rest
                .get_mut(..block.len())
                .ok_or_else(|| format!("LZ4 frame longer than the chunk's {plain} bytes"))?;
            to.copy_from_slice(block);
            block.len()
        } else if linked {
            let dict = &before[filled.saturating_sub(WINDOW)..];
            lz4_flex::block::decompress_into_with_dict(block, rest, dict)
                .map_err(|e| format!("LZ4 block at frame byte {}: {e}", at.at))?
        } else {
            lz4_flex::block::decompress_into(block, rest)
                .map_err(|e| format!("LZ4 block at frame byte {}: {e}", at.at))?
        };
        filled += n;
        if block_checksums {
            at.skip(4)?;
        }
    }
    if filled != plain {
        return Err(format!(
            "decoded to {filled} bytes, its header says {plain}"
        ));
    }
    Ok(out)
}

/// A cursor over the frame's bytes; running past its end is an error.
struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.body.len());
        let end = end
            .ok_or_else(|| format!("LZ4 frame ends at byte {} before {n} more", self.body.len()))?;
        let bytes = &self.body[self.at..end];
        self.at = end;
        Ok(bytes)
    }
    fn skip(&mut self, n: usize) -> Result<(), String> {
        self.take(n).map(drop)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        Ok(u64::from_le_bytes(w))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use lz4_flex::frame::{BlockMode, BlockSize, FrameEncoder, FrameInfo};

    use super::*;

    fn frame(data: &[u8], info: FrameInfo) -> Vec<u8> {
        let mut enc = FrameEncoder::with_frame_info(info, Vec::new());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    /// Compressible and incompressible stretches, more than one block.
    fn data(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| {
                if i % 3000 < 1500 {
                    (i / 7) as u8
                } else {
                    ((i * 2_654_435_761usize) >> 13) as u8
                }
            })
            .collect()
    }

    #[test]
    fn every_frame_layout_decodes_to_the_same_bytes() {
        for n in [1usize, 4096, 65_536, 65_537, 200_000] {
            let d = data(n);
            for mode in [BlockMode::Independent, BlockMode::Linked] {
                for (sums, size) in [(false, None), (true, Some(n as u64))] {
                    let info = FrameInfo::new()
                        .block_size(BlockSize::Max64KB)
                        .block_mode(mode)
                        .block_checksums(sums)
                        .content_checksum(sums)
                        .content_size(size);
                    let f = frame(&d, info);
                    assert_eq!(decode(&f, n).unwrap(), d, "{n} bytes, {mode:?}, {sums}");
                }
            }
        }
        let d = data(100_000);
        assert_eq!(decode(&frame(&d, FrameInfo::new()), d.len()).unwrap(), d);
    }

    #[test]
    fn a_frame_that_does_not_fit_the_plain_size_is_refused() {
        let d = data(70_000);
        let f = frame(&d, FrameInfo::new().content_size(Some(70_000)));
        assert!(decode(&f, 69_999).unwrap_err().contains("content size"));
        let f = frame(&d, FrameInfo::new());
        assert!(decode(&f, 69_999).is_err());
        assert!(decode(&f, 70_001).unwrap_err().contains("decoded to 70000"));
        assert!(decode(&f[..f.len() / 2], 70_000).is_err());
        assert!(
            decode(b"\x04\x22\x4d", 1)
                .unwrap_err()
                .contains("ends at byte 3")
        );
        assert!(decode(&[0u8; 16], 1).unwrap_err().contains("magic"));
    }
}
