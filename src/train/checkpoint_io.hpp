// THE checkpoint writer and reader of training, for 1..N ranks: topology-independent checkpoints,
// saved and loaded shard by shard. The checkpoint holds every tensor whole (its global shape):
// weights in model.safetensors, the optimizer's state BY NAME in optimizer.safetensors
// ("<state>.<parameter>", e.g. "exp_avg.h.0.attn.q_proj.weight" for AdamW, with metadata
// optimizer, state_format = 2, states, step), the step and the data cursor in trainer_state.json
// (train/state_io.hpp). So a run saved at tp2 x pp2 resumes at dp4, or on one rank, and the
// reverse. The data cursor counts sequences of the global order, independent of dp.
// Format 1 (before optimizer state was stored by name: AdamW moments "m.<name>" / "v.<name>", no
// state_format) still loads into AdamW; another optimizer refuses it, saying how to convert it.
//
// Save: the ranks all-gather the names and global shapes of the tensors (a few bytes each, listed
// by the dp 0, tp 0 rank of each pipeline position), so every rank computes the same safetensors
// header and every tensor's byte offset. Rank 0 creates the temporary checkpoint directory and
// each file with its header; then every rank writes the slices it is the saver of
// (Trainer::state_slices: tp shard rows or columns, their stage, their ZeRO shard) at their
// offsets with pwrite (core/fileio's checked OutputFile: pieces of at most the staging buffer,
// one piece per row of a column shard: checkpoint_slices.hpp), each piece through a host staging
// buffer (Backend::download: the state is device memory), and fsyncs. (Independent writes at
// offsets are all MPI_File_write_at did here; POSIX pwrite on the shared file system does the same
// and keeps one checked I/O path, whose failures every rank reports: a full disk ends the save
// everywhere with the file and the reason.) Rank 0 then checks that the ranks wrote every element
// once (their counts add up to the file's), reads each file back once for its SHA-256 and commits
// the directory (manifest, COMPLETE, rename: checkpoint/checkpoint.hpp).
// Load: rank 0 verifies the checksums and broadcasts the verdict; every rank preads the byte
// ranges of the slices of its NEW position and uploads them into its arenas and shards.
// No rank allocates more than a header-sized buffer and one staging piece for either
// (CheckpointIoStats).
//
// Owns: the training checkpoint's tensors on disk. May use: checkpoint/ (safetensors, the atomic
// directory protocol), core/fileio, train/trainer, MPI (the ranks' verdicts).
#pragma once
#include <string>

#include <mpi.h>

#include "train/state_io.hpp"
#include "train/trainer.hpp"

namespace exatrain {

// Collective over `world`. Returns the committed checkpoint directory on rank 0, "" elsewhere.
std::string save_checkpoint(Trainer& trainer, MPI_Comm world, const std::string& root, const TrainerExtras& extras,
                            int64_t keep_last);

// Collective over `world`: every rank reads its slices of checkpoint `dir`; returns the extras.
// checksums_verified: rank 0 has just verified every file's SHA-256 (e.g. resolve_resume did);
// otherwise rank 0 verifies them here. Either way the other ranks check sizes only.
TrainerExtras load_checkpoint(Trainer& trainer, MPI_Comm world, const std::string& dir,
                              bool checksums_verified = false);

// What the last save or load of this process moved, for tests of the memory bound.
struct CheckpointIoStats {
  int64_t slice_bytes = 0;           // bytes of the trainer's state slices it wrote (save) or filled (load)
  int64_t moved_bytes = 0;           // tensor bytes this rank wrote or read
  int64_t largest_buffer_bytes = 0;  // largest buffer the checkpoint code allocated (index, header, staging)
  int64_t file_data_bytes = 0;       // tensor bytes in the two safetensors files together
};
const CheckpointIoStats& last_checkpoint_io_stats();

}  // namespace exatrain
