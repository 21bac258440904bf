// Topology-independent checkpoints of the distributed trainer, saved and loaded shard by shard.
// The checkpoint holds every tensor whole (its global shape), in the single-rank trainer's format
// (train/state_io.hpp): weights in model.safetensors, AdamW moments "m.<name>" / "v.<name>" in
// optimizer.safetensors, the step and the data cursor in trainer_state.json. So a run saved at
// tp2 x pp2 resumes at dp4 (and the reverse), and single-rank and distributed checkpoints are
// interchangeable. The data cursor counts sequences of the global order, independent of dp.
//
// Save: the ranks all-gather the names and global shapes of the tensors (a few bytes each, listed
// by the dp 0, tp 0 rank of each pipeline position), so every rank computes the same safetensors
// header and every tensor's byte offset. Rank 0 creates the temporary checkpoint directory; all
// ranks open each file with MPI-IO and write the slices they are the saver of
// (DistributedTrainer::state_slices: tp shard rows or columns, their stage, their ZeRO shard)
// straight from the trainer's memory at their offsets (MPI_File_write_at, pieces of at most
// INT_MAX bytes, one piece per row of a column shard: checkpoint_slices.hpp); rank 0 writes the
// header. After MPI_File_sync (every writer's fsync) and close, rank 0 checks that the ranks
// wrote every element once (their counts add up to the file's), reads each file back once for
// its SHA-256 and commits the directory (manifest, COMPLETE, rename: checkpoint/checkpoint.hpp).
// Load: rank 0 verifies the checksums and broadcasts the verdict; every rank preads the byte
// ranges of the slices of its NEW position straight into its arenas and shards.
// No rank allocates more than a header-sized buffer for either (CheckpointIoStats).
#pragma once
#include <string>

#include <mpi.h>

#include "parallel/distributed_trainer.hpp"
#include "train/state_io.hpp"

namespace exatrain {

// Collective over `world`. Returns the committed checkpoint directory on rank 0, "" elsewhere.
std::string save_distributed_checkpoint(parallel::DistributedTrainer& trainer, MPI_Comm world,
                                        const std::string& root, const TrainerExtras& extras,
                                        int64_t keep_last);

// Collective over `world`: every rank reads its slices of checkpoint `dir`; returns the extras.
// checksums_verified: rank 0 has just verified every file's SHA-256 (e.g. resolve_resume did);
// otherwise rank 0 verifies them here. Either way the other ranks check sizes only.
TrainerExtras load_distributed_checkpoint(parallel::DistributedTrainer& trainer, MPI_Comm world,
                                          const std::string& dir, bool checksums_verified = false);

// What the last save or load of this process moved, for tests of the memory bound.
struct CheckpointIoStats {
  int64_t slice_bytes = 0;           // bytes of the trainer's state slices it wrote (save) or filled (load)
  int64_t moved_bytes = 0;           // tensor bytes this rank wrote or read
  int64_t largest_buffer_bytes = 0;  // largest buffer the checkpoint code allocated (index, header)
  int64_t file_data_bytes = 0;       // tensor bytes in the two safetensors files together
};
const CheckpointIoStats& last_checkpoint_io_stats();

}  // namespace exatrain
