-- HTTP/1.1 pipelining for wrk: every write carries `depth` requests at once
-- (default 16). wrk counts each response, so requests/s is per request.
--   wrk -t1 -c256 -d10s -s bench/wrk/pipeline.lua http://127.0.0.1:8080/plaintext -- 16
init = function(args)
  local depth = tonumber(args[1]) or 16
  local r = {}
  for i = 1, depth do
    r[i] = wrk.format(nil)
  end
  req = table.concat(r)
end

request = function()
  return req
end
