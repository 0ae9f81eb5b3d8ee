-- Argo CD health of a nodewright.io NodeWright (resource.customizations.health.nodewright.io_NodeWright).
-- Reads what the operator writes: status.observedGeneration, the kstatus conditions (Ready, Stalled,
-- Halted, Paused, Disabled) and the roll-up status.status. docs/install.md shows how to register it.
local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function is_true(kind)
  local c = condition(kind)
  return c ~= nil and c.status == "True"
end

local function message_of(kind, fallback)
  local c = condition(kind)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local annotations = (obj.metadata and obj.metadata.annotations) or {}
local status = obj.status or {}

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "being deleted: uninstalling packages and releasing nodes"
  return hs
end
if annotations["nodewright.io/disable"] == "true" or status.status == "disabled" or is_true("Disabled") then
  hs.status = "Suspended"
  hs.message = "disabled (annotation nodewright.io/disable): no node is changed"
  return hs
end
if annotations["nodewright.io/pause"] == "true" or status.status == "paused" or is_true("Paused") then
  hs.status = "Suspended"
  hs.message = "paused (annotation nodewright.io/pause): nothing new starts"
  return hs
end
if obj.status == nil or status.observedGeneration == nil
    or (obj.metadata.generation ~= nil and status.observedGeneration < obj.metadata.generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. tostring(obj.metadata.generation or "?")
  return hs
end
if is_true("Halted") then
  hs.status = "Degraded"
  hs.message = message_of("Halted", "a compartment halted after repeated failed batches")
  return hs
end
if is_true("Stalled") then
  hs.status = "Degraded"
  hs.message = message_of("Stalled", "the rollout cannot progress")
  return hs
end
if status.status == "erroring" or status.status == "blocked" then
  hs.status = "Degraded"
  hs.message = message_of("Ready", "nodes are " .. status.status)
  return hs
end
if status.status == "complete" and is_true("Ready") then
  hs.status = "Healthy"
  hs.message = message_of("Ready", "complete on every node")
  return hs
end
hs.status = "Progressing"
hs.message = message_of("Ready", "rollout " .. tostring(status.status or "starting"))
return hs
