// Topology-independent checkpoints of the distributed trainer. The checkpoint holds every tensor
// whole (its global shape), in the single-rank trainer's format (train/state_io.hpp): weights in
// model.safetensors, AdamW moments "m.<name>" / "v.<name>" in optimizer.safetensors, the step and
// the data cursor in trainer_state.json. Saving gathers each rank's slices (tp shards, pipeline
// stages, ZeRO shards of the moments) to world rank 0, which writes; loading reads the global
// tensors on every rank and keeps the slices of the rank's new position. So a run saved at
// tp2 x pp2 resumes at dp4 (and the reverse), and single-rank and distributed checkpoints are
// interchangeable. The data cursor counts sequences of the global order, independent of dp.
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

// Every rank reads `dir` (a verified checkpoint) and takes its slices; returns the extras.
TrainerExtras load_distributed_checkpoint(parallel::DistributedTrainer& trainer, const std::string& dir);

}  // namespace exatrain
