// Flat parameter buffers for ZeRO: layout, padding, shard views, and freeing/regathering
// the storage of a block's parameters without touching the tensors autograd holds.
#include "parallel/data/zero_flat.h"

#include <stdexcept>

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>

#include "memory/allocator.h"

namespace meshsim {

FlatUnit make_flat_unit(std::vector<torch::Tensor> params, int shards) {
  if (params.empty())
    throw std::invalid_argument("zero: a flat unit needs parameters");
  torch::NoGradGuard no_grad;
  FlatUnit unit;
  unit.params = std::move(params);
  for (const auto& p : unit.params) {
    if (p.scalar_type() != unit.params.front().scalar_type())
      throw std::invalid_argument("zero: all parameters of a block must have one dtype");
    unit.offsets.push_back(unit.numel);
    unit.numel += p.numel();
  }
  // Padding keeps every shard the same length, which reduce_scatter and all_gather need.
  unit.padded = (unit.numel + shards - 1) / shards * shards;
  unit.shard_numel = unit.padded / shards;
  {
    CategoryScope scope(MemoryCategory::Parameters);
    unit.full = torch::zeros({unit.padded}, unit.params.front().options().requires_grad(false));
  }
  for (size_t i = 0; i < unit.params.size(); ++i) {
    torch::Tensor& p = unit.params[i];
    torch::Tensor view = unit.full.narrow(0, unit.offsets[i], p.numel()).view(p.sizes());
    view.copy_(p);
    // set_data keeps the parameter's TensorImpl (what the module and autograd hold) and
    // points it at the flat storage; the parameter's own storage is freed here.
    p.set_data(view);
  }
  return unit;
}

torch::Tensor shard_of(const FlatUnit& unit, const torch::Tensor& t, int index) {
  return t.narrow(0, index * unit.shard_numel, unit.shard_numel);
}

void release_full(FlatUnit& unit) {
  if (!unit.materialized)
    return;
  c10::StorageImpl* storage = unit.full.storage().unsafeGetStorageImpl();
  // Destroying the old DataPtr runs the accounting allocator's deleter: the bytes leave
  // the `parameters` category now, while every view keeps its sizes and offsets.
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(static_cast<size_t>(0));
  unit.materialized = false;
}

void allocate_full(FlatUnit& unit) {
  if (unit.materialized)
    return;
  const auto nbytes = static_cast<size_t>(unit.bytes());
  c10::StorageImpl* storage = unit.full.storage().unsafeGetStorageImpl();
  CategoryScope scope(MemoryCategory::Parameters);
  c10::Allocator* allocator = storage->allocator();
  if (allocator == nullptr)
    allocator = c10::GetCPUAllocator();
  storage->set_data_ptr_noswap(allocator->allocate(nbytes));
  storage->set_nbytes(nbytes);
  unit.materialized = true;
}

void gather_full(FlatUnit& unit, Communicator& comm, const Group& group) {
  if (unit.materialized)
    return;
  torch::NoGradGuard no_grad;
  allocate_full(unit);
  torch::Tensor gathered = comm.all_gather(unit.shard, group); // [n, S] under communication
  unit.full.copy_(gathered.view({-1}));
}

void all_gather_into_full(FlatUnit& unit, Communicator& comm, const Group& group) {
  torch::NoGradGuard no_grad;
  torch::Tensor gathered = comm.all_gather(unit.shard, group);
  unit.full.copy_(gathered.view({-1}));
}

} // namespace meshsim
